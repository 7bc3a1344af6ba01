"""Placing a request on an actor: choose it, count the request there, plan its prefill.

``Placer.place`` is the one way a request (or a moving request's next attempt) gets an
actor. What placing takes is held by its result, a ``Placement``: the request's count in
the chosen actor's load and, disaggregated, the prefill plan (the prefill actor's load).
``Placement.release`` gives both back, exactly once; the request's owner
(``AdmittedRequest``) calls it when the attempt ends, whatever ends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.trace import NoOpTracer, Tracer

from dynask.control_plane.disagg.orchestrator import DisaggOrchestrator, PrefillPlan, Submit
from dynask.control_plane.observability.tracing import route_attributes
from dynask.control_plane.routing.model_routing import (
    NoReadyActorError,
    OverloadedError,
    Route,
)
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.errors import UnavailableError
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.request import PreparedRequest

RETRY_AFTER_S = 1


@dataclass
class Placement:
    """One attempt of a request on its actor, counted in that actor's load."""

    prepared: PreparedRequest  # the attempt: the original, or a moved request's resumption
    route: Route
    prefill: PrefillPlan | None = None  # disaggregated: who prefills it
    _released: bool = field(default=False, repr=False)

    @property
    def actor(self) -> ActorHandle:
        return self.route.actor

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Uncounts the attempt from its actor's load and its prefill plan; only the first
        call does anything."""
        if self._released:
            return
        self._released = True
        self.route.actor.load.release(self.prepared.request_id)
        if self.prefill is not None:
            self.prefill.release()


class Placer:
    """Places requests on the actors of their model (see the module docstring)."""

    def __init__(
        self, disagg: DisaggOrchestrator, metrics: ServingMetrics, tracer: Tracer | None = None
    ) -> None:
        self.disagg = disagg
        self.metrics = metrics
        self.tracer = tracer or NoOpTracer()  # the ``route`` span (observability.tracing)

    def place(self, prepared: PreparedRequest) -> Placement:
        """Chooses the request's actor and counts it there; an ``UnavailableError`` when no
        actor is ready or every one is at an overload threshold."""
        with self.tracer.start_as_current_span("route") as span:
            placement = self._place(prepared)
            if span.is_recording():
                span.set_attributes(route_attributes(placement.route.decision))
                span.set_attribute("dynask.remote_prefill", placement.prefill is not None)
            return placement

    def _place(self, prepared: PreparedRequest) -> Placement:
        model = prepared.model
        try:
            route = model.routing.choose(
                prepared.request_id, prepared.prompt_ids, model.serving_actors, prepared.router_mode
            )
        except NoReadyActorError as exc:
            raise UnavailableError(
                f"{exc}; retry shortly", code="no_ready_engine", retry_after_s=RETRY_AFTER_S
            ) from exc
        except OverloadedError as exc:
            self.metrics.requests_shed.labels(model.name).inc()
            raise UnavailableError(
                str(exc), code="overloaded", retry_after_s=RETRY_AFTER_S
            ) from exc
        cached = route.expected_cached_tokens
        route.actor.reserve(prepared.request_id, len(prepared.prompt_ids), cached)
        prefill = self.disagg.plan(
            model.routing,
            prepared.request_id,
            prepared.prompt_ids,
            route.actor,
            cached,
            model.prefill_actors,
        )
        return Placement(prepared, route, prefill)

    def place_beside(self, first: Placement, prepared: PreparedRequest) -> Placement:
        """Counts a sibling of ``first`` (another choice of its prompt, ``choices``) on
        ``first``'s actor, with the prompt's full blocks as cached: it starts once
        ``first`` has computed them."""
        actor, block = first.actor, first.actor.load.block_size
        cached = (len(prepared.prompt_ids) - 1) // block * block
        actor.reserve(prepared.request_id, len(prepared.prompt_ids), cached)
        note = first.route.note
        route = Route(actor, first.route.decision, cached, note and note.with_cached(cached))
        return Placement(prepared, route)

    def submitter(self, placement: Placement) -> Submit | None:
        """How the attempt goes out: through its prefill plan, or plainly (None)."""
        plan = placement.prefill
        return None if plan is None else self.disagg.submitter(plan, placement.actor)
