"""Several choices for one request: ``n > 1``, completions' ``best_of`` and prompt lists.

Design decisions:

* Each choice is an ordinary request on the engine (its own id, ``<request id>.<j>``),
  so every backend, migration and the metrics treat it like any other.
* The siblings of one prompt share its KV blocks through the prefix cache: they go to
  the actor the first sibling was routed to, and start once the first has its first
  token, so its prompt's full blocks are in the cache and each sibling computes only the
  last, partial block. The cost is one prefill of latency for the siblings' first token.
* All choices of a response are admitted together or not at all, waiting for room for
  all of them at once (``AdmittedRequest.enter_group``): they are generated together,
  so a part admitted alone would hold slots only its own siblings could free.
* A seeded request gives sibling ``j`` the seed ``seed + j``: every choice reproducible,
  and distinct from its siblings (equal seeds would draw equal tokens).
* Choices stream interleaved as they come; an error in one ends them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from dynask.actors.api.outputs import RequestOutput
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.request import PreparedRequest
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.serving.tenants import Tenant

Follow = Callable[[AdmittedRequest], AsyncIterator[list[RequestOutput]]]


@dataclass(frozen=True)
class PromptChoices:
    """The admitted siblings of one prompt; ``routed[0]`` goes first."""

    routed: list[AdmittedRequest]


def sibling(prepared: PreparedRequest, j: int) -> PreparedRequest:
    """Sibling ``j`` of a prepared request (``j = 0`` keeps its seed)."""
    params = prepared.params
    if j and params.seed is not None:
        seed = (params.seed + j + 2**63) % 2**64 - 2**63  # stays int64
        params = dataclasses.replace(params, seed=seed)
    return dataclasses.replace(prepared, request_id=f"{prepared.request_id}.{j}", params=params)


async def enter_choices(
    service: ServingService,
    prepared: list[PreparedRequest],
    count: int,
    tenant: Tenant | None = None,
) -> list[PromptChoices]:
    """Admits ``count`` siblings of each prompt, all at once (waiting for room for all
    of them at an admission limit): sibling 0 as any request, the others onto its
    actor; each counts against ``tenant``'s limits."""
    groups = [[sibling(item, j) for j in range(count)] for item in prepared]
    admitted = await service.enter_group(groups, tenant)
    return [PromptChoices(routed) for routed in admitted]


async def stream_choices(
    groups: list[PromptChoices], follow: Follow
) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
    """Every choice's deltas as ``(choice index, delta)``, batches in arrival order.

    Choice indexes run prompt by prompt: prompt ``i``'s sibling ``j`` is ``i * n + j``.
    """
    queue: asyncio.Queue[tuple[int, list[RequestOutput]] | BaseException | None] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []

    async def run(
        index: int, routed: AdmittedRequest, then: list[tuple[int, AdmittedRequest]]
    ) -> None:
        try:
            async for outputs in follow(routed):
                if then:  # the first sibling has its first token: its prompt is cached
                    tasks.extend(start(i, r, []) for i, r in then)
                    then = []
                queue.put_nowait((index, outputs))
            queue.put_nowait(None)
        except BaseException as exc:
            queue.put_nowait(exc)
            raise

    def start(
        index: int, routed: AdmittedRequest, then: list[tuple[int, AdmittedRequest]]
    ) -> asyncio.Task[None]:
        return asyncio.create_task(run(index, routed, then), name=routed.prepared.request_id)

    total, index = 0, 0
    for group in groups:
        numbered = [(index + j, r) for j, r in enumerate(group.routed)]
        index += len(numbered)
        total += len(numbered)
        tasks.append(start(*numbered[0], numbered[1:]))
    done = 0
    try:
        while done < total:
            item = await queue.get()
            if item is None:
                done += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                choice, outputs = item
                yield [(choice, o) for o in outputs]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in groups:
            for routed in group.routed:
                routed.release()
