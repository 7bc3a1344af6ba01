"""Engine actors that outlive their control plane: published on the scheduler, adopted.

A Dask actor lives as long as some client holds its key. If that is only the control
plane's client, a control plane that crashes (or is killed) takes every engine with it,
and a restart reloads every model. So each actor's future is *published* on the
scheduler as a dataset (``dynask-actor/NAME``, with its deployment and engine spec): the
scheduler then holds the key whatever happens to the client. A restarted control plane
lists those datasets and adopts every actor whose deployment still wants it with the
same spec (``start()`` is idempotent and answers with the actor's info); the others are
stopped. An actor that cannot be reached within ``ADOPT_TIMEOUT_S`` is dropped, and the
reconciler starts a replacement.

Several control planes may serve the same actors (``leadership``): only the leader
stops, drops or withdraws; followers adopt every actor the leader publishes and let go
of the ones it withdraws. The last control plane that stops normally stops its actors
and withdraws their datasets; any other leaves them to the rest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.runtime.engine_factory import EngineSpec

log = logging.getLogger(__name__)

DATASET_PREFIX = "dynask-actor/"
ADOPT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PublishedActor:
    """An engine actor found on the scheduler, reachable and started."""

    name: str
    deployment: str
    spec: EngineSpec
    future: Any  # distributed.Future of the actor
    proxy: Any  # distributed.Actor
    info: ActorInfo


async def publish(client: Any, name: str, deployment: str, spec: EngineSpec, future: Any) -> None:
    record = {"future": future, "deployment": deployment, "spec": spec}
    await client.publish_dataset(record, name=DATASET_PREFIX + name, override=True)


async def withdraw(client: Any, name: str) -> None:
    """Removes the actor's dataset (the scheduler then releases the actor's key)."""
    try:
        await asyncio.wait_for(client.unpublish_dataset(DATASET_PREFIX + name), ADOPT_TIMEOUT_S)
    except Exception as exc:  # gone already, or the scheduler is away: nothing left to undo
        log.debug("withdrawing the dataset of %s failed: %s", name, exc)


async def published_names(client: Any) -> set[str]:
    """The names of the engine actors published now."""
    names = [str(n) for n in await client.list_datasets()]
    return {n.removeprefix(DATASET_PREFIX) for n in names if n.startswith(DATASET_PREFIX)}


async def adopt(client: Any, name: str) -> PublishedActor:
    """The published actor ``name``, reached and started (``start()`` is idempotent);
    raises when it cannot be reached within ``ADOPT_TIMEOUT_S`` (its worker died)."""
    record = await client.get_dataset(DATASET_PREFIX + name)
    proxy = await asyncio.wait_for(record["future"], ADOPT_TIMEOUT_S)
    info = ActorInfo.from_dict(await asyncio.wait_for(proxy.start(), ADOPT_TIMEOUT_S))
    return PublishedActor(name, record["deployment"], record["spec"], record["future"], proxy, info)
