"""The serving core behind every front end: models, their actors, prompts and generation.

A request is prepared (validated against its model, tokenized, its ``SamplingParams``
built once), admitted (``admit``: an admission slot, then the ``Placer`` picks the actor
and the actor's load counts the request at once, so requests routed meanwhile see it),
then generated. Admission happens before any response starts, so shedding under overload
is a plain 503 with ``Retry-After``, streaming or not. The admitted request is one object
(``AdmittedRequest``) that gives back everything it holds exactly once.

Failures are domain errors (``serving.errors``); the HTTP layer maps them to responses,
and the terminal front ends (``in=text``, ``in=batch``) print them.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from opentelemetry.trace import NoOpTracer, Tracer

from dynask.actors.api.outputs import RequestOutput
from dynask.actors.api.sampling_params import SamplingParamError, SamplingParams
from dynask.actors.models.tokenizer_folder import load_tokenizer
from dynask.control_plane.disagg.orchestrator import DisaggOptions, DisaggOrchestrator
from dynask.control_plane.observability.tracing import prepare_attributes
from dynask.control_plane.reliability.migration import RequestMigration
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle, ActorUnavailableError
from dynask.control_plane.serving.admission import Admission, AdmissionRefusedError
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    UnavailableError,
)
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.placer import Placer
from dynask.control_plane.serving.request import GenerationRequest, PreparedRequest, ServedModel
from dynask.control_plane.serving.structured_output_support import refuse_unless_served
from dynask.control_plane.serving.tenants import ANONYMOUS, Tenant, TenantGate, TenantLimitError
from dynask.control_plane.state.api_keys import PRIORITIES, KeyTenant, TenantLimits

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a context overflow
# A prompt is refused before tokenizing when its text, at this many bytes per token (about
# what BPE tokenizers average on English), would fill the context this many times over:
# no real text averages 16 bytes per token, so only prompts that cannot fit are refused.
BYTES_PER_TOKEN = 4
OBVIOUSLY_TOO_LONG = 4
QUOTED_CHARS = 80
PRIORITY_HEADER = "x-dynask-priority"


class ServingService:
    def __init__(
        self,
        metrics: ServingMetrics,
        routing: RoutingOptions | None = None,
        disagg: DisaggOptions | None = None,
        reliability: ReliabilityOptions | None = None,
        tenant_defaults: TenantLimits | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracer = tracer or NoOpTracer()  # request spans (observability.tracing); no-op: off
        self.tenant_defaults = tenant_defaults or TenantLimits()  # for user / anonymous
        self.tenants = TenantGate(
            observe=lambda tenant, in_flight: metrics.tenant_in_flight.labels(tenant).set(in_flight)
        )
        self.routing = routing or RoutingOptions()
        self.disagg = DisaggOrchestrator(disagg, self.tracer)
        metrics.watch_disagg(self.disagg.counters)
        self.reliability = reliability or ReliabilityOptions()
        self.models: dict[str, ServedModel] = {}
        self.admission = Admission(
            self.reliability.max_in_flight,
            self.reliability.max_queued_prefill_tokens,
            self.reliability.admission_wait_s,
        )
        self.placer = Placer(self.disagg, metrics, self.tracer)
        self.migration = RequestMigration(self.reliability, metrics, self.placer)
        # An inference graph's custom Processor (graph_runtime.ProcessorHook), or None.
        self.request_hook: Callable[[GenerationRequest], Awaitable[GenerationRequest]] | None = None

    # ---- actors -------------------------------------------------------------------

    def add_actor(self, model_name: str, handle: ActorHandle) -> None:
        model = self.models.get(model_name)
        if model is None:
            tokenizer = tokenizer_from_files(handle.info.tokenizer_files)
            routing = ModelRouting(model_name, self.routing, self.metrics)
            defaults = dict(handle.info.sampling_defaults)
            model = ServedModel(model_name, tokenizer, routing, sampling_defaults=defaults)
            self.models[model_name] = model
        model.actors.append(handle)
        model.routing.add_actor(handle)

    def remove_actor(self, actor_name: str) -> ActorHandle | None:
        """Stops routing to the actor and drops its blocks from the prefix index."""
        for model in self.models.values():
            for handle in model.actors:
                if handle.name == actor_name:
                    model.actors.remove(handle)
                    model.routing.remove_actor(actor_name)
                    return handle
        return None

    def actors(self) -> list[ActorHandle]:
        return [a for m in self.models.values() for a in m.actors]

    def ready_actors(self) -> list[ActorHandle]:
        return [a for a in self.actors() if not a.broken]

    # ---- requests -----------------------------------------------------------------

    def refuse_obviously_too_long(self, request: GenerationRequest) -> None:
        """A prompt whose text alone is far longer than the context is refused before it is
        templated or tokenized (tokenizing megabytes takes seconds)."""
        limit = self.model(request.model).max_model_len
        text_bytes = request.text_bytes()
        if text_bytes / BYTES_PER_TOKEN > limit * OBVIOUSLY_TOO_LONG:
            raise InvalidRequestError(
                request.prompt_param,
                f"this model's context is {limit} tokens, but the prompt has {text_bytes} "
                f"bytes of text (about {text_bytes // BYTES_PER_TOKEN} tokens); shorten the "
                "prompt",
                code=CONTEXT_LENGTH_EXCEEDED,
            )

    def prepare(self, request: GenerationRequest, prefix: str) -> PreparedRequest:
        """Applies the chat template and tokenizes: CPU-bound, so the HTTP layer calls it
        in a worker thread (``asyncio.to_thread``), never on the event loop. A prompt
        whose text is obviously longer than the context is refused before tokenizing."""
        with self.tracer.start_as_current_span("prepare") as span:
            prepared = self._prepare(request, prefix)
            if span.is_recording():
                span.set_attributes(prepare_attributes(prepared))
            return prepared

    def _prepare(self, request: GenerationRequest, prefix: str) -> PreparedRequest:
        model = self.model(request.model)
        if "structured_output" in request.sampling:
            refuse_unless_served([a.info.engine for a in model.serving_actors])
        limit = model.max_model_len
        prompt_param = request.prompt_param
        self.refuse_obviously_too_long(request)
        prompt_ids = self._prompt_ids(model, request)
        if len(prompt_ids) >= limit:
            raise InvalidRequestError(
                prompt_param,
                f"this model's context is {limit} tokens, but the prompt has {len(prompt_ids)} "
                "tokens; shorten the prompt",
                code=CONTEXT_LENGTH_EXCEEDED,
            )
        max_tokens = request.max_tokens or limit - len(prompt_ids)
        if len(prompt_ids) + max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens",
                f"this model's context is {limit} tokens: the prompt has {len(prompt_ids)} "
                f"tokens and max_tokens is {max_tokens}; ask for at most "
                f"{limit - len(prompt_ids)} tokens",
                code=CONTEXT_LENGTH_EXCEEDED,
            )
        try:
            sampling = {**model.sampling_defaults, **request.sampling}  # the request's win
            params = SamplingParams(**sampling, max_tokens=max_tokens)
        except SamplingParamError as exc:
            raise InvalidRequestError(exc.field, str(exc)) from exc
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        return PreparedRequest(request_id, model, prompt_ids, params, request.router_mode)

    def model(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None or not model.actors:
            available = ", ".join(sorted(m for m, v in self.models.items() if v.actors)) or "none"
            raise ModelNotFoundError(
                f"the model {_quoted(name)} does not exist or has no ready engine; "
                f"available: {available}"
            )
        return model

    def _prompt_ids(self, model: ServedModel, request: GenerationRequest) -> list[int]:
        if request.messages is not None:
            ids = model.tokenizer.apply_chat_template(
                request.messages, add_generation_prompt=True, tokenize=True
            )
            if not isinstance(ids, list):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        if isinstance(request.prompt, str):
            return [int(t) for t in model.tokenizer.encode(request.prompt)]
        vocab = len(model.tokenizer)
        prompt = list(request.prompt or [])
        if prompt and (min(prompt) < 0 or max(prompt) >= vocab):  # in C: prompts run long
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise InvalidRequestError(
                "prompt", f"token id {bad} is outside the vocabulary [0, {vocab})"
            )
        return prompt

    def tenant(
        self, key: KeyTenant | None, user: str | None, asked_priority: str | None = None
    ) -> Tenant:
        """Who a request counts against: its API key, else its ``user`` field, else
        ``anonymous`` (the last two with the server's default limits). ``asked_priority``
        (the ``x-dynask-priority`` header) may lower the tenant's priority class, never
        raise it: a key's class is what its owner is trusted with; a high key's batch
        job asks for ``low``. An unknown class is a 400 naming the header."""
        if key is not None:
            tenant = Tenant(key.name, key.limits)
        else:
            tenant = Tenant(f"user:{user}" if user else ANONYMOUS, self.tenant_defaults)
        if asked_priority is None:
            return tenant
        asked = asked_priority.strip().lower()
        if asked not in PRIORITIES:
            raise InvalidRequestError(
                PRIORITY_HEADER,
                f"the header {PRIORITY_HEADER} has value {_quoted(asked_priority)}; expected "
                "one of " + ", ".join(PRIORITIES),
            )
        own = tenant.limits.priority
        if PRIORITIES.index(asked) <= PRIORITIES.index(own):
            return tenant  # the same class, or higher than the key allows: its own
        return Tenant(tenant.name, dataclasses.replace(tenant.limits, priority=asked))

    def refuse_early(self, tenant: Tenant) -> None:
        """A ``TenantLimitError`` (429) if ``tenant`` is over a limit whatever the request:
        called before templating and tokenizing, so refusing a noisy tenant is cheap."""
        try:
            self.tenants.refuse_early(tenant)
        except TenantLimitError as exc:
            self.metrics.tenant_requests.labels(tenant.name, exc.limit).inc()
            raise

    def admit(
        self,
        prepared: PreparedRequest,
        tenant: Tenant | None = None,
        beside: AdmittedRequest | None = None,
    ) -> AdmittedRequest:
        """Admits the request and places it on an actor (``beside``'s, for a sibling
        choice); a ``TenantLimitError`` (a 429 over HTTP) when its tenant is over a
        limit, an ``UnavailableError`` (a 503) at an admission limit, when no actor is
        ready or every one is at an overload threshold. Never waits (``enter`` does)."""
        tenant = tenant or Tenant(ANONYMOUS, self.tenant_defaults)
        try:
            return AdmittedRequest.admit(
                prepared,
                self.admission,
                self.placer,
                self.tenants.slot(tenant, self.metrics),
                beside,
            )
        except AdmissionRefusedError as exc:
            self.metrics.admission_refused.labels(exc.limit).inc()
            raise

    async def enter(
        self,
        prepared: PreparedRequest,
        tenant: Tenant | None = None,
        beside: AdmittedRequest | None = None,
    ) -> AdmittedRequest:
        """``admit``, except that at an admission limit the request waits (up to
        ``--admission-wait``) for room, in weighted fair order of priority classes and
        tenants (``Admission.turn``). What the HTTP front ends call."""
        [[admitted]] = await self.enter_group([[prepared]], tenant, beside)
        return admitted

    async def enter_group(
        self,
        groups: list[list[PreparedRequest]],
        tenant: Tenant | None = None,
        beside: AdmittedRequest | None = None,
    ) -> list[list[AdmittedRequest]]:
        """``enter`` for the choices of one response, all admitted together: each group's
        first request is placed as any (beside ``beside``, if given), the others of its
        group beside it (``AdmittedRequest.enter_group``)."""
        tenant = tenant or Tenant(ANONYMOUS, self.tenant_defaults)
        priority, waited_from = tenant.limits.priority, time.monotonic()
        waiting = self.metrics.admission_waiting.labels(priority)
        waiting.inc()
        try:
            admitted = await AdmittedRequest.enter_group(
                groups,
                self.admission,
                self.placer,
                self.tenants.slot(tenant, self.metrics),
                beside,
            )
        except AdmissionRefusedError as exc:
            self.metrics.admission_refused.labels(exc.limit).inc()
            raise
        finally:
            waiting.dec()
        wait = time.monotonic() - waited_from
        self.metrics.admission_wait.labels(tenant.name, priority).observe(wait)
        return admitted

    async def generate(self, admitted: AdmittedRequest) -> AsyncIterator[list[RequestOutput]]:
        """Yields the admitted request's deltas (as they arrive, in batches), then releases
        what it holds; a request whose actor is lost moves to another (``migration``);
        with prefill actors its prefill may run on one of them (``disagg``)."""
        with admitted:
            try:
                async for outputs in self.migration.follow(admitted):
                    yield outputs
            except ActorUnavailableError as exc:
                raise UnavailableError(str(exc), code="engine_unavailable") from exc

    def decisions(self, limit: int, model: str | None = None) -> list[dict[str, Any]]:
        """The ``limit`` most recent routing decisions (of one model or all), newest first."""
        models = [m for m in self.models.values() if model is None or m.name == model]
        recent = [
            {"model": m.name, **decision.to_dict()}
            for m in models
            for decision in m.routing.decisions.recent(limit)
        ]
        recent.sort(key=lambda item: item["decided_at"], reverse=True)
        return recent[:limit]


def tokenizer_from_files(files: dict[str, bytes]) -> Any:
    """A tokenizer rebuilt from the files an actor sent (the control plane has no weights)."""
    with tempfile.TemporaryDirectory() as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        return load_tokenizer(Path(folder))


def _quoted(text: str) -> str:
    """``text`` quoted for a message, in ASCII (a NUL or a megabyte of it cannot break
    the answer), cut to about ``QUOTED_CHARS``."""
    return ascii(text[:QUOTED_CHARS]) + ("..." if len(text) > QUOTED_CHARS else "")
