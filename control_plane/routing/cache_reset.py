"""Emptying the engines' prefix caches, and the routers' knowledge of them with it.

Design decisions:

- What it is for: a benchmark whose phases share engines (``bench.routing.trace_replay``
  runs each routing mode on the same actors) starts each phase as a fresh engine would,
  and an operator drops what a workload no longer needs. vLLM has the same endpoint
  (``/reset_prefix_cache``) and SGLang a ``/flush_cache``. Two front ends use it:
  ``POST /v1/engines/reset_prefix_cache`` and the admin UI's routing page.
- Each engine decides for itself, under its step lock: it resets only when no request
  holds KV blocks (a running request's blocks must keep their identity). Every engine's
  result is reported (``EngineReset``), with the reason when it did not reset; an actor
  that does not answer is reported, not raised.
- The routers follow: an engine with KV events sends ``AllBlocksCleared`` and the exact
  index drops its blocks; the reset waits (at most ``HEAR_WAIT_S``) until this control
  plane has applied it (the actor returns the event's id), so the next request is routed
  without them. The events come on the actor's stream, the answer on another connection.
  What the router only assumed (the approximate index, the predicted blocks) is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.serving.actor_handle import CALL_TIMEOUT_S, ActorHandle
from dynask.control_plane.serving.request import ServedModel

HEAR_WAIT_S = 2.0  # for the routers to apply an engine's AllBlocksCleared


@dataclass(frozen=True)
class EngineReset:
    """One engine's answer to a reset."""

    name: str
    model: str
    reset: bool
    reason: str | None  # why not, when ``reset`` is false

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def reset_prefix_caches(
    models: Mapping[str, ServedModel], names: list[str]
) -> list[EngineReset]:
    """Asks every live engine actor of the models ``names`` to empty its prefix cache."""
    targets = [(name, a) for name in names for a in models[name].actors if not a.broken]
    answers = await asyncio.gather(*(_ask(actor) for _, actor in targets))
    results, heard = [], []
    for (model, actor), answer in zip(targets, answers, strict=True):
        done = bool(answer.get("reset"))
        if done:
            routing = models[model].routing
            routing.forget_cached(actor.name)
            heard.append(_heard(routing, actor.name, answer.get("event_id")))
        results.append(EngineReset(actor.name, model, done, answer.get("reason")))
    await asyncio.gather(*heard)
    return results


async def _ask(actor: ActorHandle) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = await asyncio.wait_for(
            actor.proxy.reset_prefix_cache(), CALL_TIMEOUT_S
        )
    except Exception as exc:  # unreachable or old actor: its entry says so
        return {"reset": False, "reason": f"the engine actor did not answer: {exc!r}"}
    return answer


async def _heard(routing: ModelRouting, actor: str, event_id: int | None) -> None:
    if event_id is None or routing.sync(actor) is None:
        return
    deadline = time.monotonic() + HEAR_WAIT_S
    while routing.prefix.expected_event_id(actor) <= event_id and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
