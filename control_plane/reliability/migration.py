"""Request migration: a stream whose engine actor is lost continues on another actor.

When an actor's token stream breaks (its worker died, or ``actor_health`` declared it
lost), ``ActorHandle.generate`` raises ``ActorUnavailableError``. ``follow`` then
re-issues the request to another actor of the same model: the prompt plus the tokens the
client already has, and the rest of the ``max_tokens`` budget. The client's stream goes
on from where it was, with no token repeated and none missing.

Design decisions:

- Resume point: the tokens the client has (``stream_progress``: deltas whose text the
  engine still held wait until text comes, so nothing the client got is regenerated).
  Text the lost engine held back as a possible stop-string prefix is rebuilt with the
  tokenizer and joined to the next attempt's text, where a stop string that straddles
  the migration point still ends the request (``resume_text``).
- Penalties and ``min_tokens`` go on where they were: the resumed request says how many
  tokens at the end of its prompt it generated itself (``output_in_prompt``), and the
  engine counts them as output (the presence and frequency penalties count output tokens
  only, so without it they would start again from zero after a move).
- Sampled requests move too. The built-in engine draws each token from a generator
  seeded by (request seed, position), so a greedy or *seeded* request continues exactly
  as it would have on the lost actor. An unseeded sampled request continues from the
  tokens shown with a fresh seed the new engine picks: as valid a sample as the lost one.
  A seeded request on another engine (vLLM keeps one stateful generator per request) is
  refused once it has shown tokens: its promised continuation is gone with the actor.
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
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import cast

from opentelemetry.trace import Status, StatusCode

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.runtime.tracing import traceparent_of
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.reliability.resume_text import StopCarry, held_back_text
from dynask.control_plane.reliability.stream_progress import StreamProgress
from dynask.control_plane.serving.actor_handle import ActorUnavailableError
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import UnavailableError
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.placer import Placement, Placer
from dynask.control_plane.serving.request import PreparedRequest

log = logging.getLogger(__name__)

_PLACE_RETRY_S = (0.05, 0.1, 0.2, 0.5)  # waits between tries to find a ready actor


# Engines whose sampled tokens are a function of (seed, position): a seeded request
# moved between them continues exactly (the built-in engine, ``actors.engine.sampling``).
POSITION_SEEDED_ENGINES = frozenset({"torch"})


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
        moves, carry = 0, None
        while True:
            try:
                async for outputs in self._attempt(admitted, progress, carry, moves):
                    yield outputs
                return
            except ActorUnavailableError as exc:
                lost, engine = admitted.actor.name, admitted.actor.info.engine
                admitted.leave_actor()
                self._check_movable(original, progress, (lost, engine), moves, exc)
                moves += 1
                progress.drop_held()
                carry = _stop_carry(original, progress)
                if progress.remaining < 1:  # every token was out: only the end was lost
                    yield [_length_finish(original.request_id, progress, carry)]
                    return
                with self.placer.tracer.start_as_current_span("migrate") as span:
                    span.set_attributes(
                        {
                            "dynask.migration.from_actor": lost,
                            "dynask.migration.move": moves,
                            "dynask.migration.tokens_sent": len(progress.sent),
                        }
                    )
                    placement = await self._move(original, progress, moves, lost)
                    span.set_attribute("dynask.migration.to_actor", placement.actor.name)
                admitted.move_to(placement)

    async def _attempt(
        self,
        admitted: AdmittedRequest,
        progress: StreamProgress,
        carry: StopCarry | None,
        moves: int,
    ) -> AsyncIterator[list[RequestOutput]]:
        placement = admitted.placement
        prepared = placement.prepared
        submit = self.placer.submitter(placement)
        first = True
        # Started, never made current: this generator yields while it is open.
        span = self.placer.tracer.start_span(
            "generate", attributes=_attempt_attributes(placement, moves)
        )
        deltas = cast(  # an async generator: closed at once when a carried stop ends it
            AsyncGenerator[list[RequestOutput], None],
            placement.actor.generate(
                prepared.request_id,
                prepared.prompt_ids,
                prepared.params,
                submit,
                traceparent_of(span),
                placement.route.note,
            ),
        )
        try:
            async with aclosing(deltas):
                async for batch in deltas:
                    if first:
                        admitted.first_token()
                        span.add_event("first_token")
                        first = False
                    outputs = batch
                    if prepared.prompt_ids is not progress.prompt_ids:
                        outputs = [whole_request_usage(o, progress) for o in outputs]
                    if carry is not None:
                        outputs = _carried(carry, outputs, progress)
                    released = progress.release(outputs)
                    if released:
                        yield released
                    if outputs[-1].finished:
                        span.set_attribute("dynask.finish_reason", str(outputs[-1].finish_reason))
                        return
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise
        finally:
            span.set_attribute("dynask.tokens_sent", len(progress.sent))
            span.end()

    def _check_movable(
        self,
        original: PreparedRequest,
        progress: StreamProgress,
        lost: tuple[str, str],
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
        lost: tuple[str, str],
        moves: int,
        cause: Exception,
    ) -> tuple[str, str] | None:
        (name, engine), limit = lost, self.options.migration_limit
        if moves >= limit:
            return "limit", (
                f"engine actor {name} was lost ({cause}) and request {original.request_id} "
                f"has already moved {moves} times (--migration-limit {limit}); it was not "
                f"moved again after {len(progress.sent)} tokens"
            )
        params = original.params
        seeded = params.seed is not None and not params.greedy
        if seeded and progress.sent and engine not in POSITION_SEEDED_ENGINES:
            return "seeded", (
                f"engine actor {name} was lost after {len(progress.sent)} tokens of request "
                f"{original.request_id}; its engine ({engine}) draws seeded tokens from a "
                "generator whose state was lost with it, so the continuation its seed promises "
                "cannot be rebuilt elsewhere; retry it (or send it without a seed: unseeded "
                "requests move with a fresh one)"
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
        # The penalties and min_tokens count them as output (``output_in_prompt``).
        shown = len(progress.sent)
        params = _grammar_resumed(original.params, shown)
        resumed = dataclasses.replace(
            original,
            request_id=f"{original.request_id}-m{moves}",
            prompt_ids=progress.resume_prompt() if progress.sent else original.prompt_ids,
            params=dataclasses.replace(
                params, max_tokens=progress.remaining, output_in_prompt=shown
            ),
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
                        f"after {len(progress.sent)} tokens",
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
            len(progress.sent),
            moves,
        )
        return placement


def _attempt_attributes(placement: Placement, moves: int) -> dict[str, str | int]:
    return {
        "dynask.actor": placement.actor.name,
        "dynask.request_id": placement.prepared.request_id,
        "dynask.attempt": moves,
        "dynask.prompt_tokens": len(placement.prepared.prompt_ids),
    }


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


def _stop_carry(original: PreparedRequest, progress: StreamProgress) -> StopCarry | None:
    """What joins the lost engine's held-back text to the next attempt's (stop strings)."""
    stops = original.params.stop
    if not stops or not progress.sent:
        return None
    held = held_back_text(
        original.model.tokenizer,
        original.prompt_ids,
        progress.sent,
        progress.shown_text,
        original.params.skip_special_tokens,
    )
    return StopCarry(held, stops)


def _carried(
    carry: StopCarry, outputs: list[RequestOutput], progress: StreamProgress
) -> list[RequestOutput]:
    """``outputs`` through ``carry``, ending at the first delta a straddling stop ends."""
    carried = []
    tokens = len(progress.sent) + sum(len(o.token_ids) for o in progress.held)
    for output in outputs:
        tokens += len(output.token_ids)
        carried.append(carry.apply(output, Usage(len(progress.prompt_ids), tokens, 0)))
        if carried[-1].finished:
            break
    return carried


def _length_finish(
    request_id: str, progress: StreamProgress, carry: StopCarry | None
) -> RequestOutput:
    """The final delta of a request whose every token had reached the client."""
    usage = Usage(len(progress.prompt_ids), len(progress.sent), 0)
    final = RequestOutput(request_id, "", (), FinishReason.LENGTH, usage=usage)
    return final if carry is None else carry.apply(final, usage)


def _grammar_resumed(params: SamplingParams, generated_tokens: int) -> SamplingParams:
    """The params of a continuation whose prompt ends with ``generated_tokens`` tokens the
    request generated before: its grammar (if any) replays them."""
    grammar = params.structured_output
    if grammar is None or generated_tokens == 0:
        return params
    return dataclasses.replace(params, structured_output=grammar.resumed_after(generated_tokens))
