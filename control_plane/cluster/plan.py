"""What the reconciler builds for a deployment (``state.deployment.DeploymentSpec``, the
one deployment type): its ``EngineSpec``, the model name clients use, and each replica's
``EngineActor`` on the worker the reconciler chose (``create_actor``: a worker with a
``GPU`` resource gives one GPU to it; a prefill or decode actor also opens its KV
transfer listener, ``with_kv_listener``). Each actor call is bounded by
``ACTOR_START_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from distributed import Client, Future

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.state.deployment import DeploymentSpec, Role


def engine_spec(deployment: DeploymentSpec) -> EngineSpec:
    """The engine each replica of ``deployment`` runs (ValueError if it cannot be one)."""
    return EngineSpec(
        kind=deployment.engine,
        model=deployment.model_path,
        python_file=deployment.engine_file if deployment.engine == "python" else None,
        engine_args=dict(deployment.engine_args),
        url=deployment.engine_file if deployment.engine == "openai" else None,
    )


def served_name(model: str | None) -> str:
    """The model name clients use: the file stem, folder name or hub id."""
    if not model:
        return "SmolLM2-135M-Instruct"
    path = Path(model)
    if path.exists():
        return path.stem.split(".")[0] if path.is_file() else path.name
    return model


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
