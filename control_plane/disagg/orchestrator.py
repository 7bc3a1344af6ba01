"""Disaggregated prefill and decode: when a prompt is prefilled on another actor, and how.

Design decisions:

- A served model whose actors include both ``prefill`` and ``decode`` roles is served
  disaggregated. Requests are routed to the non-prefill actors as usual (the router's
  mode: ``kv`` weighs load and the prompt blocks each one caches); prefill actors only
  prefill, unless no other actor is up (``ServedModel.serving_actors``): then the one
  a request lands on serves it alone, with no remote prefill (sending its KV to itself
  is a wasted copy, and over ``cuda_ipc`` it fails: a process cannot open its own CUDA
  IPC handles; so failed every remote prefill of the first H200 stack run, whose
  requests came before the decode engine was up).
- Conditional, as in Dynamo: the decode actor prefills by itself when the prompt's
  tokens it does not cache (by the router's index) are fewer than
  ``min_remote_prefill_tokens``, when the chosen actor has no KV listener (an
  aggregated actor), or when every prefill actor already has
  ``max_prefills_per_actor`` prefills in flight. Otherwise a prefill actor is chosen
  KV-aware among the ones with room (the decision lands in the routing log, under the
  request id with ``/prefill``).
- The request is handed to the decode actor first (``prepare_remote_prefill``): it
  reserves the blocks and from then on owns the request, falling back to a local
  prefill by itself if the KV does not arrive in ``transfer_timeout_s``. Only then is
  the prefill actor asked (``prefill_remote``), in a task of its own; if that call
  fails, the decode actor is told to fall back at once. The client's stream reads the
  decode actor's deltas as for any request, and a client that leaves aborts the request
  on the decode actor, never the prefill in flight (its blocks are freed after it sent).
- Bad input (``ValueError`` from the decode actor) fails the request as usual; any other
  failure to hand it over disaggregated submits it plainly instead.
- Router replicas: the prefill router's note goes with ``prefill_remote`` (``PrefillPlan.
  routed``), and the prefill actor passes it to its other readers, so the other control
  planes count the prefill in that actor's ``peer_load`` and score it as this one does
  (``actors.runtime.kv_transfer_actor``), and ``max_prefills_per_actor`` bounds the
  prefills of all of them together. A prefill actor from before that (no
  ``shares_prefill_routings`` in its info) is called without the note: it prefills, and
  the other control planes do not hear of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import NoOpTracer, Status, StatusCode, Tracer

from dynask.control_plane.flags import flag, non_negative_int
from dynask.control_plane.routing.model_routing import (
    ModelRouting,
    NoReadyActorError,
    OverloadedError,
)
from dynask.control_plane.routing.peer_routings import RoutingNote
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.state.deployment import Role

log = logging.getLogger(__name__)


Submit = Callable[[bytes], Awaitable[None]]


def _transports() -> tuple[str, ...]:
    from dynask.kv.transfer import TRANSPORTS

    return tuple(TRANSPORTS)


@dataclass(frozen=True)
class DisaggOptions:
    """When prompts are prefilled remotely and how KV moves (``dynask run/serve`` flags)."""

    transport: str = flag(
        "--kv-transport",
        "tcp",
        "how KV blocks move between actors (ucxx needs the ucxx-cu12/cu13 wheel; cuda_ipc: "
        "GPU engines of one host, device to device into the decode engine's blocks)",
        choices=_transports,
    )
    min_remote_prefill_tokens: int = flag(
        "--remote-prefill-min-tokens",
        64,
        "prompts with fewer tokens uncached on the decode engine prefill there (default {default})",
        type=non_negative_int,
    )
    max_prefills_per_actor: int = flag(
        "--max-prefills-per-worker",
        8,
        "remote prefills in flight per prefill engine; when all are at it, the decode "
        "engine prefills (default {default})",
        type=non_negative_int,
    )
    transfer_timeout_s: float = flag(
        "--kv-transfer-timeout",
        30.0,
        "seconds a decode engine waits for remote KV before prefilling itself "
        "(default {default:g})",
        type=float,
    )

    def __post_init__(self) -> None:
        from dynask.kv.transfer import TRANSPORTS

        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"DisaggOptions 'transport' has value {self.transport!r}; "
                f"expected one of {', '.join(TRANSPORTS)}"
            )
        for name in ("min_remote_prefill_tokens", "max_prefills_per_actor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"DisaggOptions '{name}' has value {value!r}; expected int >= 0")
        if not 0 < self.transfer_timeout_s < float("inf"):
            raise ValueError(
                f"DisaggOptions 'transfer_timeout_s' has value {self.transfer_timeout_s!r}; "
                "expected a number > 0"
            )


@dataclass
class PrefillPlan:
    """The prefill actor chosen for one request (its load counts the prefill until the
    prefill is over or the request ends, whichever comes first)."""

    request_id: str
    prefill_actor: ActorHandle
    note: RoutingNote | None = None  # the prefill router's, for the other control planes
    released: bool = False

    @property
    def load_key(self) -> str:
        return f"{self.request_id}/prefill"

    def routed(self) -> dict[str, Any] | None:
        """What the prefill actor passes on to its other readers (``prefill_remote``)."""
        if self.note is None:
            return None
        return {"o": self.prefill_actor.reader_id, "r": self.note.to_wire()}

    def release(self) -> None:
        """Uncounts the prefill from the prefill actor's load; only the first call acts."""
        if not self.released:
            self.released = True
            self.prefill_actor.load.release(self.load_key)


class DisaggOrchestrator:
    """Plans and runs remote prefills for a ``ServingService`` (see the module docstring)."""

    def __init__(self, options: DisaggOptions | None = None, tracer: Tracer | None = None) -> None:
        self.options = options or DisaggOptions()
        self.tracer = tracer or NoOpTracer()  # kv_handover, remote_prefill spans
        self.counters: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    def plan(
        self,
        routing: ModelRouting,
        request_id: str,
        prompt_ids: Sequence[int],
        decode: ActorHandle,
        cached_on_decode: int,
        prefill_actors: Sequence[ActorHandle],
    ) -> PrefillPlan | None:
        """A prefill actor for the request, or None when the decode actor prefills it."""
        if not prefill_actors or decode.info.kv_transfer_address is None:
            return None
        if decode.role == Role.PREFILL:
            self.counters["local_on_prefill_actor"] += 1
            return None
        if len(prompt_ids) - cached_on_decode < self.options.min_remote_prefill_tokens:
            self.counters["local_short_or_cached"] += 1
            return None
        limit = self.options.max_prefills_per_actor
        # Prefills in flight there: this control plane's and, heard through the actor,
        # the other control planes' (router replicas).
        free = [
            a for a in prefill_actors if not a.broken and a.in_flight + len(a.peer_load) < limit
        ]
        key = f"{request_id}/prefill"
        try:
            route = routing.choose(key, prompt_ids, free) if free else None
        except (NoReadyActorError, OverloadedError):
            route = None
        if route is None:
            self.counters["local_prefill_busy"] += 1
            return None
        route.actor.reserve(key, len(prompt_ids), route.expected_cached_tokens)
        return PrefillPlan(request_id, route.actor, route.note)

    def submitter(self, plan: PrefillPlan, decode: ActorHandle) -> Submit:
        """What ``ActorHandle.generate`` calls instead of its plain submission. The plan
        ends (``release``) when no remote prefill happens, else when it is over."""

        async def submit(packed: bytes) -> None:
            prefilling = False
            try:
                with self.tracer.start_as_current_span(
                    "kv_handover", attributes={"dynask.decode_actor": decode.name}
                ) as span:
                    ticket = await decode.proxy.prepare_remote_prefill(
                        packed, self.options.transfer_timeout_s
                    )
                    span.set_attribute("dynask.remote_prefill", ticket is not None)
                if ticket is None:
                    self.counters["local_decided_by_decode"] += 1
                    return
                task = asyncio.create_task(self._prefill(plan, decode, bytes(ticket), packed))
                prefilling = True
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            except ValueError:
                raise
            except Exception as exc:
                log.warning("disaggregated hand-over to %s failed (%s)", decode.name, exc)
                self.counters["local_handover_failed"] += 1
                await decode.proxy.submit(packed)
            finally:
                if not prefilling:
                    plan.release()

        return submit

    async def _prefill(
        self, plan: PrefillPlan, decode: ActorHandle, ticket: bytes, packed: bytes
    ) -> None:
        attributes = {
            "dynask.prefill_actor": plan.prefill_actor.name,
            "dynask.decode_actor": decode.name,
        }
        span = self.tracer.start_span("remote_prefill", attributes=attributes)
        try:
            proxy, timeout_s = plan.prefill_actor.proxy, self.options.transfer_timeout_s
            routed = plan.routed()
            if routed is None or not plan.prefill_actor.info.shares_prefill_routings:
                blocks = await proxy.prefill_remote(ticket, packed, timeout_s)  # older actors too
            else:
                blocks = await proxy.prefill_remote(ticket, packed, timeout_s, routed)
        except Exception as exc:  # the decode actor falls back; say why in the log
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, "remote prefill failed; decode prefills"))
            self.counters["remote_prefill_failed"] += 1
            log.warning(
                "remote prefill of %s on %s failed (%s); %s prefills it",
                plan.request_id,
                plan.prefill_actor.name,
                exc,
                decode.name,
            )
            await self._cancel_quietly(plan.request_id, decode)
        else:
            span.set_attribute("dynask.kv_blocks_moved", int(blocks))
            self.counters["remote_prefills"] += 1
            self.counters["blocks_moved"] += int(blocks)
        finally:
            span.end()
            plan.release()

    async def _cancel_quietly(self, request_id: str, decode: ActorHandle) -> None:
        try:
            await decode.proxy.cancel_remote_prefill(request_id)
        except Exception as exc:  # its own timeout still ends the wait
            log.warning("cancelling the transfer of %s on %s: %s", request_id, decode.name, exc)

    async def wait_idle(self) -> None:
        """Returns once no prefill task is running (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
