"""The serving core behind the HTTP API: models, their actors, prompts and generation.

A request is prepared (validated, tokenized), routed (``route``: the model's
``ModelRouting`` picks the actor and the actor's load counts the request at once, so
requests routed meanwhile see it), then generated. Routing happens before any response
starts, so shedding under overload is a plain 503 with ``Retry-After``, streaming or not.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynask.actors.api.outputs import RequestOutput
from dynask.control_plane.api.errors import APIError, invalid
from dynask.control_plane.api.request_schema import GenerationRequest
from dynask.control_plane.disagg.orchestrator import (
    PREFILL_ROLE,
    DisaggOptions,
    DisaggOrchestrator,
    PrefillPlan,
    Submit,
)
from dynask.control_plane.reliability.migration import RequestMigration
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.model_routing import (
    ModelRouting,
    NoReadyActorError,
    OverloadedError,
    Route,
    RoutingOptions,
)
from dynask.control_plane.serving.actor_handle import ActorHandle, ActorUnavailableError
from dynask.control_plane.serving.admission import Admission, AdmissionRefusedError
from dynask.control_plane.serving.metrics import ServingMetrics

RETRY_AFTER_S = 1


@dataclass
class ServedModel:
    name: str
    tokenizer: Any
    routing: ModelRouting
    actors: list[ActorHandle] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_model_len(self) -> int:
        return min(a.max_model_len for a in self.actors) if self.actors else 0

    @property
    def prefill_actors(self) -> list[ActorHandle]:
        return [a for a in self.actors if a.role == PREFILL_ROLE]

    @property
    def serving_actors(self) -> list[ActorHandle]:
        """The actors requests are routed to: all but the prefill-only ones (or, if a
        model has nothing else, those too, prefilling and decoding by themselves)."""
        return [a for a in self.actors if a.role != PREFILL_ROLE] or self.actors


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request turned into what an actor takes."""

    request_id: str
    model: ServedModel
    prompt_ids: list[int]
    params: dict[str, Any]
    router_mode: str | None = None  # the request's own choice; None: the server's


@dataclass(frozen=True)
class RoutedRequest:
    """A prepared request and the actor chosen for it (already counted in its load)."""

    prepared: PreparedRequest
    route: Route
    prefill: PrefillPlan | None = None  # disaggregated: who prefills it
    admission: Admission | None = None  # set for a request admitted by ``route``

    @property
    def actor(self) -> ActorHandle:
        return self.route.actor

    def release(self) -> None:
        """Uncounts the request from admission, its actor's load and its prefill plan
        (idempotent; ``generate`` does it)."""
        if self.admission is not None:
            self.admission.release(self.prepared.request_id)
        self.release_actor()

    def release_actor(self) -> None:
        """Uncounts the request from its actor's load and its prefill plan (idempotent)."""
        self.route.actor.load.release(self.prepared.request_id)
        if self.prefill is not None:
            self.prefill.release_unless_started()


class ServingService:
    def __init__(
        self,
        metrics: ServingMetrics,
        routing: RoutingOptions | None = None,
        disagg: DisaggOptions | None = None,
        reliability: ReliabilityOptions | None = None,
    ) -> None:
        self.metrics = metrics
        self.routing = routing or RoutingOptions()
        self.disagg = DisaggOrchestrator(disagg)
        self.reliability = reliability or ReliabilityOptions()
        self.models: dict[str, ServedModel] = {}
        self.admission = Admission(
            self.reliability.max_in_flight, self.reliability.max_queued_prefill_tokens
        )
        self.migration = RequestMigration(self.reliability, metrics, self.admission)
        # An inference graph's custom Processor (graph_runtime.ProcessorHook), or None.
        self.request_hook: Callable[[GenerationRequest], Awaitable[GenerationRequest]] | None = None

    # ---- actors -------------------------------------------------------------------

    def add_actor(self, model_name: str, handle: ActorHandle) -> None:
        model = self.models.get(model_name)
        if model is None:
            tokenizer = tokenizer_from_files(handle.info["tokenizer_files"])
            routing = ModelRouting(model_name, self.routing, self.metrics)
            model = ServedModel(model_name, tokenizer, routing)
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

    def prepare(self, request: GenerationRequest, prefix: str) -> PreparedRequest:
        model = self.model(request.model)
        prompt_ids = self._prompt_ids(model, request)
        limit = model.max_model_len
        if len(prompt_ids) >= limit:
            raise invalid(
                "messages" if request.messages is not None else "prompt",
                f"this model's context is {limit} tokens, but the prompt has {len(prompt_ids)} "
                "tokens; shorten the prompt",
            )
        max_tokens = request.max_tokens or limit - len(prompt_ids)
        if len(prompt_ids) + max_tokens > limit:
            raise invalid(
                "max_tokens",
                f"this model's context is {limit} tokens: the prompt has {len(prompt_ids)} "
                f"tokens and max_tokens is {max_tokens}; ask for at most "
                f"{limit - len(prompt_ids)} tokens",
            )
        params = {**request.sampling, "max_tokens": max_tokens}
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        return PreparedRequest(request_id, model, prompt_ids, params, request.router_mode)

    def model(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None or not model.actors:
            available = ", ".join(sorted(m for m, v in self.models.items() if v.actors)) or "none"
            raise APIError(
                f"the model '{name}' does not exist or has no ready engine; available: {available}",
                status=404,
                param="model",
                code="model_not_found",
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
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise invalid("prompt", f"token id {bad} is outside the vocabulary [0, {vocab})")
        return prompt

    def route(self, prepared: PreparedRequest) -> RoutedRequest:
        """Admits the request, chooses its actor and counts it there; a 503 ``APIError``
        at an admission limit, when no actor is ready or every one is at an overload
        threshold."""
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        try:
            self.admission.admit(prepared.request_id, len(prepared.prompt_ids))
        except AdmissionRefusedError as exc:
            self.metrics.admission_refused.labels(exc.limit).inc()
            raise APIError(str(exc), status=503, code="overloaded", headers=retry) from exc
        try:
            routed = self.place(prepared)
        except BaseException:
            self.admission.release(prepared.request_id)
            raise
        return dataclasses.replace(routed, admission=self.admission)

    def place(self, prepared: PreparedRequest) -> RoutedRequest:
        """Chooses the request's actor and counts it there (no admission: a moving
        request is admitted already)."""
        model = prepared.model
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        try:
            route = model.routing.choose(
                prepared.request_id, prepared.prompt_ids, model.serving_actors, prepared.router_mode
            )
        except NoReadyActorError as exc:
            raise APIError(
                f"{exc}; retry shortly", status=503, code="no_ready_engine", headers=retry
            ) from exc
        except OverloadedError as exc:
            self.metrics.requests_shed.labels(model.name).inc()
            raise APIError(str(exc), status=503, code="overloaded", headers=retry) from exc
        prompt_tokens = len(prepared.prompt_ids)
        route.actor.reserve(prepared.request_id, prompt_tokens, route.expected_cached_tokens)
        prefill = self.disagg.plan(
            model.routing,
            prepared.request_id,
            prepared.prompt_ids,
            route.actor,
            route.expected_cached_tokens,
            model.prefill_actors,
        )
        return RoutedRequest(prepared, route, prefill)

    async def generate(self, routed: RoutedRequest) -> AsyncIterator[list[RequestOutput]]:
        """Yields the routed request's deltas (as they arrive, in batches); a request whose
        actor is lost moves to another (``request_migration``); with prefill actors its
        prefill may run on one of them (``disagg_orchestrator``)."""
        try:
            async for outputs in self.migration.follow(routed, self.place, self._submitter):
                yield outputs
        except ActorUnavailableError as exc:
            raise APIError(str(exc), status=503, code="engine_unavailable") from exc
        finally:
            routed.release()

    def _submitter(self, routed: RoutedRequest) -> Submit | None:
        """How an attempt goes out: through its prefill plan, or plainly (None)."""
        plan = routed.prefill
        return None if plan is None else self.disagg.submitter(plan, routed.actor)

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
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        return AutoTokenizer.from_pretrained(folder)
