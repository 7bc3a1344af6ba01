"""Creating one engine actor on a chosen worker, up to its answered info.

The reconciler decides where (``reconciler``, ``failed_starts``) and records what
happens; this module only creates the ``EngineActor`` on that worker (a worker with a
``GPU`` resource gives one GPU to it), starts its engine, and opens the KV transfer
listener of a prefill or decode actor. Each step is bounded by ``ACTOR_START_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed import Client, Future

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.state.deployment import Role

ACTOR_START_TIMEOUT_S = 900.0  # creating an actor and loading its model


async def create_actor(
    client: Client, spec: EngineSpec, name: str, worker: dict[str, Any]
) -> tuple[Any, Future[Any], ActorInfo]:
    """The actor ``name`` on ``worker``, its engine started: (proxy, future, info)."""
    resources = {"GPU": 1} if worker.get("resources", {}).get("GPU") else None
    future = client.submit(
        EngineActor,
        spec,
        name,
        actor=True,
        workers=[str(worker["address"])],
        allow_other_workers=False,
        resources=resources,
        key=name,
        pure=False,
    )
    proxy = await asyncio.wait_for(future, ACTOR_START_TIMEOUT_S)
    answer = await asyncio.wait_for(proxy.start(), ACTOR_START_TIMEOUT_S)
    return proxy, future, ActorInfo.from_dict(answer)


async def with_kv_listener(proxy: Any, role: Role, info: ActorInfo, transport: str) -> ActorInfo:
    """A prefill or decode actor's info with its KV listener's address (opened once; an
    adopted actor answers with the one it has)."""
    if role == Role.AGGREGATED:
        return info
    address = await asyncio.wait_for(proxy.open_kv_transfer(transport), ACTOR_START_TIMEOUT_S)
    return info.with_kv_transfer(address)
