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

A control plane that stops normally stops its actors and withdraws their datasets.
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


async def find_published(client: Any) -> list[PublishedActor]:
    """Every published actor that answers; the unreachable ones are withdrawn."""
    names = [n for n in await client.list_datasets() if str(n).startswith(DATASET_PREFIX)]
    found = []
    for dataset in names:
        name = str(dataset).removeprefix(DATASET_PREFIX)
        try:
            record = await client.get_dataset(dataset)
            proxy = await asyncio.wait_for(record["future"], ADOPT_TIMEOUT_S)
            info = ActorInfo.from_dict(await asyncio.wait_for(proxy.start(), ADOPT_TIMEOUT_S))
        except Exception as exc:  # its worker died while no control plane watched
            log.warning("published engine actor %s is unreachable (%s); dropping it", name, exc)
            await withdraw(client, name)
            continue
        found.append(
            PublishedActor(
                name, record["deployment"], record["spec"], record["future"], proxy, info
            )
        )
    return found
