"""OpenTelemetry traces of requests: the options, the tracer, and what spans say.

One trace per request. Spans, parent first (control plane, then an engine actor's):

    POST /v1/chat/completions           http_tracing.TraceRequests (the client's traceparent)
      prepare                           chat template + tokenize (ServingService.prepare)
      route                             the routing decision, every term (Placer.place)
      generate                          one attempt on one actor (RequestMigration)
        kv_handover, remote_prefill     disaggregated: hand-over, prefill + KV transfer
        engine.request                  the actor's side (actors.runtime.tracing)
          engine.queue, engine.prefill, engine.decode
          engine.kv_import_prepare      (decode actor) / engine.remote_prefill (prefill actor)
      migrate                           a lost actor: where the request went (its own route)
      generate                          the next attempt

Design decisions:

- Off unless ``--otel-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. Off, every
  component holds OpenTelemetry's no-op tracer: no span is recorded, no traceparent is
  sent to actors, no plugin runs on the workers.
- No process-global tracer provider: ``Tracing`` owns it and hands its tracer to the
  service, which hands it to the placer, the migration and the disaggregation
  orchestrator (tests build one over the SDK's in-memory exporter).
- The trace context reaches the actors inside the request bytes of the actor call
  (``token_stream.pack_request``), as the W3C ``traceparent`` of the attempt's span.
- Spans that outlive a ``yield`` (``generate``) are started with an explicit parent and
  never made current: a context attached inside an async generator would leak into its
  consumer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, Tracer

from dynask.actors.runtime.tracing import TracingPlugin, otlp_tracer_provider
from dynask.control_plane.flags import flag

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class TracingOptions:
    """Where traces go (``dynask run/serve`` flags)."""

    otel_endpoint: str | None = flag(
        "--otel-endpoint",
        None,
        "send OpenTelemetry traces over OTLP/HTTP to this collector, e.g. "
        f"http://127.0.0.1:4318 (default: ${ENDPOINT_ENV}; unset: no tracing)",
    )
    otel_service_name: str = flag(
        "--otel-service-name",
        "dynask",
        "service.name of the control plane's spans; engines add '-engine' (default {default})",
    )

    def __post_init__(self) -> None:
        endpoint = self.otel_endpoint
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"TracingOptions 'otel_endpoint' has value {endpoint!r}; expected an "
                "http:// or https:// URL of an OTLP/HTTP collector"
            )

    def traces_url(self) -> str | None:
        """The OTLP/HTTP traces URL (``…/v1/traces``), or None when tracing is off."""
        base = self.otel_endpoint or os.environ.get(ENDPOINT_ENV)
        if not base:
            return None
        base = base.rstrip("/")
        return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


class Tracing:
    """The control plane's tracer provider, its tracer, and the workers' plugin."""

    def __init__(self, provider: Any = None, worker_plugin: TracingPlugin | None = None) -> None:
        self.provider = provider  # None: off
        self.worker_plugin = worker_plugin
        self.tracer: Tracer = (
            NoOpTracer() if provider is None else provider.get_tracer("dynask.control_plane")
        )

    @classmethod
    def from_options(cls, options: TracingOptions) -> Tracing:
        url = options.traces_url()
        if url is None:
            return cls()
        provider = otlp_tracer_provider(url, options.otel_service_name)
        return cls(provider, TracingPlugin(url, f"{options.otel_service_name}-engine"))

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def shutdown(self) -> None:
        """Exports what is batched and stops (the server's exit)."""
        if self.provider is not None:
            self.provider.shutdown()


def route_attributes(decision: Any) -> dict[str, Any]:
    """A routing decision (``kv_router.RoutingDecision``) as span attributes: the winner's
    terms, and every candidate's in parallel arrays (candidate order)."""
    winner = decision.winner_score
    scores = decision.scores
    return {
        "dynask.routing.mode": decision.mode,
        "dynask.routing.actor": decision.winner,
        "dynask.routing.prompt_blocks": decision.prompt_blocks,
        "dynask.routing.overlap_blocks": winner.overlap_blocks,
        "dynask.routing.uncached_blocks": winner.uncached_blocks,
        "dynask.routing.prefill_blocks": winner.prefill_blocks,
        "dynask.routing.decode_blocks": winner.decode_blocks,
        "dynask.routing.cost": float(winner.cost),
        "dynask.routing.compute_us": float(decision.compute_us),
        "dynask.routing.candidates": [s.actor for s in scores],
        "dynask.routing.candidate_costs": [float(s.cost) for s in scores],
        "dynask.routing.candidate_overlap_blocks": [s.overlap_blocks for s in scores],
    }


def is_recording(tracer: Tracer) -> bool:
    """Whether ``tracer`` records anything (False for the no-op tracer: skip the work)."""
    return not isinstance(tracer, NoOpTracer)


__all__ = ["Tracing", "TracingOptions", "is_recording", "route_attributes", "trace"]


def prepare_attributes(prepared: Any) -> dict[str, Any]:
    """A prepared request (``serving.request.PreparedRequest``) as span attributes."""
    return {
        "dynask.model": prepared.model.name,
        "dynask.request_id": prepared.request_id,
        "dynask.prompt_tokens": len(prepared.prompt_ids),
        "dynask.max_tokens": prepared.params.max_tokens,
    }
