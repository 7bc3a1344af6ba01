"""Request migration: a stream whose engine actor is lost continues on another actor.

When an actor's token stream breaks (its worker died, or ``actor_health`` declared it
lost), ``ActorHandle.generate`` raises ``ActorUnavailableError``. ``follow`` then
re-issues the request to another actor of the same model: the prompt plus the tokens the
client already has, and the rest of the ``max_tokens`` budget. The client's stream goes
on from where it was, with no token repeated and none missing.

Design decisions:

- Resume point. A delta can carry tokens whose text the engine held back (the first
  bytes of a multi-byte character, or text that might still become a stop string). The
  client has not seen that text, and the new engine would treat those tokens as prompt
  and never show it. So the request resumes after the last delta that carried text: the
  tokens after it are generated again by the new actor, which then emits their text in
  full. For greedy decoding the regenerated tokens are the same ones.
- What can be rebuilt. A greedy request (``temperature`` 0 or ``top_k`` 1) continues
  exactly: the built-in engine's output is a function of the tokens so far. A request
  whose client has seen no text yet is re-issued as it was (a seeded one gives the same
  tokens). A *sampled* request that has shown text is refused: its generator's state
  after N draws lives only in the lost actor, and resuming with a fresh generator would
  silently give a different continuation than the one the seed promises. The error says
  so and what to do (temperature 0 for requests that must survive a worker loss).
- Bounded: at most ``migration_limit`` moves per request, and a moving request waits at
  most ``migration_wait_s`` for a ready actor (with one replica, the reconciler's
  replacement). Every refusal is an ``APIError`` that names the actor and the reason.
- The attempt's request id is the original with ``-m1``, ``-m2`` …: a hung actor that
  wakes up later cannot deliver into the new attempt.
- Usage of the final delta is the whole request's: the original prompt, every token the
  client got.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.control_plane.api.errors import APIError
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.serving.actor_handle import ActorUnavailableError
from dynask.control_plane.serving.admission import Admission
from dynask.control_plane.serving.metrics import ServingMetrics

if TYPE_CHECKING:
    from dynask.control_plane.serving.service import PreparedRequest, RoutedRequest

log = logging.getLogger(__name__)

_PLACE_RETRY_S = (0.05, 0.1, 0.2, 0.5)  # waits between tries to find a ready actor

Place = Callable[["PreparedRequest"], "RoutedRequest"]
Submitter = Callable[["RoutedRequest"], Callable[[bytes], Awaitable[None]] | None]


def is_greedy(params: dict[str, Any]) -> bool:
    """The request's tokens follow from its prompt alone (SamplingParams' defaults)."""
    return float(params.get("temperature", 1.0)) == 0.0 or int(params.get("top_k", 0)) == 1


@dataclasses.dataclass
class StreamProgress:
    """What the client of one request has received so far."""

    prompt_ids: list[int]
    max_tokens: int
    sent: list[int] = dataclasses.field(default_factory=list)  # token ids handed out
    shown: int = 0  # tokens through the last delta that carried text: the resume point

    def note(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            self.sent.extend(output.token_ids)
            if output.text:
                self.shown = len(self.sent)

    def resume_prompt(self) -> list[int]:
        return self.prompt_ids + self.sent[: self.shown]

    def rewind(self) -> None:
        """Forgets the tokens after the resume point: the next actor generates them again."""
        del self.sent[self.shown :]

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.shown


class RequestMigration:
    """Follows one request across actors; see the module docstring."""

    def __init__(
        self, options: ReliabilityOptions, metrics: ServingMetrics, admission: Admission
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.admission = admission

    async def follow(
        self, routed: RoutedRequest, place: Place, submitter: Submitter = lambda _: None
    ) -> AsyncIterator[list[RequestOutput]]:
        """Yields the request's deltas; moves it when its actor is lost (``place`` picks
        and counts the next actor, as ``ServingService.place`` does; ``submitter`` says
        how each attempt goes out: its disaggregated prefill, or None for a plain one)."""
        original = routed.prepared
        progress = StreamProgress(original.prompt_ids, int(original.params["max_tokens"]))
        attempt, moves = routed, 0
        try:
            while True:
                try:
                    submit = submitter(attempt)
                    async for outputs in self._attempt(
                        attempt, original.request_id, progress, submit
                    ):
                        yield outputs
                    return
                except ActorUnavailableError as exc:
                    lost = attempt.actor.name
                    attempt.release_actor()
                    self._check_movable(original, progress, lost, moves, exc)
                    moves += 1
                    progress.rewind()
                    if progress.remaining < 1:  # every token was out: only the end was lost
                        yield [_length_finish(original.request_id, progress)]
                        return
                    attempt = await self._move(original, progress, moves, lost, place)
        finally:
            attempt.release_actor()

    async def _attempt(
        self,
        attempt: RoutedRequest,
        original_id: str,
        progress: StreamProgress,
        submit: Callable[[bytes], Awaitable[None]] | None,
    ) -> AsyncIterator[list[RequestOutput]]:
        prepared = attempt.prepared
        first = True
        async for outputs in attempt.actor.generate(
            prepared.request_id, prepared.prompt_ids, prepared.params, submit
        ):
            if first:
                self.admission.prefill_done(original_id)
                first = False
            if prepared.prompt_ids is not progress.prompt_ids:
                outputs = [whole_request_usage(o, progress) for o in outputs]
            progress.note(outputs)
            yield outputs

    def _check_movable(
        self,
        original: PreparedRequest,
        progress: StreamProgress,
        lost: str,
        moves: int,
        cause: Exception,
    ) -> None:
        """Raises the ``APIError`` that ends the request if it may not move again."""
        refusal = self._refusal(original, progress, lost, moves, cause)
        if refusal is not None:
            reason, message = refusal
            self.metrics.migrations_refused.labels(original.model.name, reason).inc()
            raise APIError(message, status=503, code="engine_lost") from cause

    def _refusal(
        self,
        original: PreparedRequest,
        progress: StreamProgress,
        lost: str,
        moves: int,
        cause: Exception,
    ) -> tuple[str, str] | None:
        shown, limit = progress.shown, self.options.migration_limit
        if moves >= limit:
            return "limit", (
                f"engine actor {lost} was lost ({cause}) and request {original.request_id} "
                f"has already moved {moves} times (--migration-limit {limit}); it was not "
                f"moved again after {shown} tokens"
            )
        if shown and not is_greedy(original.params):
            temperature = original.params.get("temperature", 1.0)
            return "sampled", (
                f"engine actor {lost} was lost after {shown} tokens of request "
                f"{original.request_id} had been sent; it samples (temperature={temperature}) "
                "and its random state cannot be rebuilt on another engine, so it was not "
                "continued there (that would silently change the continuation); retry it, "
                "or send temperature 0 for requests that must survive a worker loss"
            )
        return None

    async def _move(
        self,
        original: PreparedRequest,
        progress: StreamProgress,
        moves: int,
        lost: str,
        place: Place,
    ) -> RoutedRequest:
        resumed = dataclasses.replace(
            original,
            request_id=f"{original.request_id}-m{moves}",
            prompt_ids=progress.resume_prompt() if progress.shown else original.prompt_ids,
            params={**original.params, "max_tokens": progress.remaining},
        )
        deadline = time.monotonic() + self.options.migration_wait_s
        tries = 0
        while True:
            try:
                routed = place(resumed)
                break
            except APIError as exc:
                if exc.status != 503 or time.monotonic() >= deadline:
                    self.metrics.migrations_refused.labels(original.model.name, "no_engine").inc()
                    raise APIError(
                        f"engine actor {lost} was lost and no other engine of model "
                        f"'{original.model.name}' took request {original.request_id} within "
                        f"{self.options.migration_wait_s:g} s ({exc.message}); it stopped "
                        f"after {progress.shown} tokens",
                        status=503,
                        code="engine_lost",
                    ) from exc
                await asyncio.sleep(_PLACE_RETRY_S[min(tries, len(_PLACE_RETRY_S) - 1)])
                tries += 1
        self.metrics.migrations.labels(original.model.name).inc()
        log.warning(
            "request %s moved from lost actor %s to %s after %d tokens (move %d)",
            original.request_id,
            lost,
            routed.actor.name,
            progress.shown,
            moves,
        )
        return routed


def whole_request_usage(output: RequestOutput, progress: StreamProgress) -> RequestOutput:
    """A resumed attempt's delta, its usage counted for the whole request."""
    if output.usage is None:
        return output
    original_prompt = len(progress.prompt_ids)
    resumed_after = output.usage.prompt_tokens - original_prompt  # tokens the client had
    usage = Usage(
        prompt_tokens=original_prompt,
        completion_tokens=resumed_after + output.usage.completion_tokens,
        cached_tokens=min(output.usage.cached_tokens, original_prompt),
    )
    return dataclasses.replace(output, usage=usage)


def _length_finish(request_id: str, progress: StreamProgress) -> RequestOutput:
    """The final delta of a request whose every token had reached the client."""
    usage = Usage(len(progress.prompt_ids), progress.shown, 0)
    return RequestOutput(request_id, "", (), FinishReason.LENGTH, usage=usage)
