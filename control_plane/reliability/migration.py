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
- What can be rebuilt. A greedy request (``SamplingParams.greedy``) continues
  exactly: the built-in engine's output is a function of the tokens so far. A request
  whose client has seen no text yet is re-issued as it was (a seeded one gives the same
  tokens). A *sampled* request that has shown text is refused: its generator's state
  after N draws lives only in the lost actor, and resuming with a fresh generator would
  silently give a different continuation than the one the seed promises. The error says
  so and what to do (temperature 0 for requests that must survive a worker loss).
- Bounded: at most ``migration_limit`` moves per request, and a moving request waits at
  most ``migration_wait_s`` for a ready actor (with one replica, the reconciler's
  replacement). Every refusal is an ``UnavailableError`` (code ``engine_lost``) that
  names the actor and the reason.
- The request's owner (``AdmittedRequest``) holds its placement: a move gives the lost
  actor's back at once (``leave_actor``) and takes the next one from the ``Placer``
  (``move_to``); whatever ends the request, its owner releases the rest.
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
from collections.abc import AsyncIterator

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.serving.actor_handle import ActorUnavailableError
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import UnavailableError
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.placer import Placement, Placer
from dynask.control_plane.serving.request import PreparedRequest

log = logging.getLogger(__name__)

_PLACE_RETRY_S = (0.05, 0.1, 0.2, 0.5)  # waits between tries to find a ready actor


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
        self, options: ReliabilityOptions, metrics: ServingMetrics, placer: Placer
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.placer = placer  # picks and counts each next actor, plans its prefill

    async def follow(self, admitted: AdmittedRequest) -> AsyncIterator[list[RequestOutput]]:
        """Yields the request's deltas; moves it when its actor is lost. What it holds is
        released by ``admitted`` itself, not here."""
        original = admitted.prepared
        progress = StreamProgress(original.prompt_ids, original.params.max_tokens)
        moves = 0
        while True:
            try:
                async for outputs in self._attempt(admitted, progress):
                    yield outputs
                return
            except ActorUnavailableError as exc:
                lost = admitted.actor.name
                admitted.leave_actor()
                self._check_movable(original, progress, lost, moves, exc)
                moves += 1
                progress.rewind()
                if progress.remaining < 1:  # every token was out: only the end was lost
                    yield [_length_finish(original.request_id, progress)]
                    return
                admitted.move_to(await self._move(original, progress, moves, lost))

    async def _attempt(
        self, admitted: AdmittedRequest, progress: StreamProgress
    ) -> AsyncIterator[list[RequestOutput]]:
        placement = admitted.placement
        prepared = placement.prepared
        submit = self.placer.submitter(placement)
        first = True
        async for outputs in placement.actor.generate(
            prepared.request_id, prepared.prompt_ids, prepared.params, submit
        ):
            if first:
                admitted.first_token()
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
        """Raises the ``UnavailableError`` that ends the request if it may not move again."""
        refusal = self._refusal(original, progress, lost, moves, cause)
        if refusal is not None:
            reason, message = refusal
            self.metrics.migrations_refused.labels(original.model.name, reason).inc()
            raise UnavailableError(message, code="engine_lost") from cause

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
        if shown and not original.params.greedy:
            temperature = original.params.temperature
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
    ) -> Placement:
        # A grammar replays the tokens the client has (they end the resumed prompt).
        params = _grammar_resumed(original.params, progress.shown)
        resumed = dataclasses.replace(
            original,
            request_id=f"{original.request_id}-m{moves}",
            prompt_ids=progress.resume_prompt() if progress.shown else original.prompt_ids,
            params=dataclasses.replace(params, max_tokens=progress.remaining),
        )
        deadline = time.monotonic() + self.options.migration_wait_s
        tries = 0
        while True:
            try:
                placement = self.placer.place(resumed)
                break
            except UnavailableError as exc:
                if time.monotonic() >= deadline:
                    self.metrics.migrations_refused.labels(original.model.name, "no_engine").inc()
                    raise UnavailableError(
                        f"engine actor {lost} was lost and no other engine of model "
                        f"'{original.model.name}' took request {original.request_id} within "
                        f"{self.options.migration_wait_s:g} s ({exc.message}); it stopped "
                        f"after {progress.shown} tokens",
                        code="engine_lost",
                    ) from exc
                await asyncio.sleep(_PLACE_RETRY_S[min(tries, len(_PLACE_RETRY_S) - 1)])
                tries += 1
        self.metrics.migrations.labels(original.model.name).inc()
        log.warning(
            "request %s moved from lost actor %s to %s after %d tokens (move %d)",
            original.request_id,
            lost,
            placement.actor.name,
            progress.shown,
            moves,
        )
        return placement


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


def _grammar_resumed(params: SamplingParams, generated_tokens: int) -> SamplingParams:
    """The params of a continuation whose prompt ends with ``generated_tokens`` tokens the
    request generated before: its grammar (if any) replays them."""
    grammar = params.structured_output
    if grammar is None or generated_tokens == 0:
        return params
    return dataclasses.replace(params, structured_output=grammar.resumed_after(generated_tokens))
