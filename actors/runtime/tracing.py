"""OpenTelemetry on the engine side: the spans an engine actor adds to a request's trace.

A traced request reaches its actor with the W3C ``traceparent`` of the control plane's
span for that attempt (``token_stream.pack_request``); the actor's spans are its
children, so one trace shows the request from the HTTP call down to the engine's steps.

Design decisions:

- Off unless the control plane registers ``TracingPlugin`` on the workers (it does when
  ``--otel-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set). The plugin owns the
  worker's tracer provider and OTLP exporter: no process-global provider is set, and an
  actor without the plugin ignores traceparents (its engine thread does no tracing work).
- Engine spans are written once the request finishes, with the times recorded on the way
  (``EngineSpans``): the engine thread records two timestamps per request and never
  holds a span open across steps.
- ``engine.queue`` and ``engine.prefill`` are told apart by step boundaries: the engine
  hands each step's deltas over in one call, so the step that produced a request's first
  token began when the previous step's deltas were handed over (or at the request's
  arrival, if the engine was idle). ``engine.queue`` is arrival → that step's start (waiting,
  and any earlier chunks of a chunked prefill), ``engine.prefill`` is that step,
  ``engine.decode`` first token → last.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dynask.actors.api.outputs import RequestOutput

PLUGIN_NAME = "dynask-tracing"
TRACEPARENT = "traceparent"
EXPORT_DELAY_MS = 1000  # how long finished spans wait in the batch before export
_PROPAGATOR = TraceContextTextMapPropagator()


def traceparent_of(span: Span) -> str | None:
    """The W3C ``traceparent`` header naming ``span`` as the parent (None: not sampled)."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def context_from(traceparent: str | None) -> otel_context.Context | None:
    """The context a ``traceparent`` names as parent; None when absent or malformed."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


@contextmanager
def attached(traceparent: str | None) -> Iterator[None]:
    """Makes ``traceparent``'s span current for a synchronous block (tasks created in it
    inherit it). Never hold it across an ``await`` of a generator's ``yield``."""
    ctx = context_from(traceparent)
    if ctx is None:
        yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def otlp_tracer_provider(
    endpoint: str | None, service_name: str, export_delay_ms: int = EXPORT_DELAY_MS
) -> Any:
    """A tracer provider exporting over OTLP/HTTP to ``endpoint`` (the full
    ``…/v1/traces`` URL; None: the SDK reads ``OTEL_EXPORTER_OTLP_*``)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=export_delay_ms))
    return provider


class TracingPlugin(WorkerPlugin):
    """Gives a worker's engine actors a tracer exporting to ``endpoint`` (see the module
    docstring). Holds only strings until ``setup``, so Dask can ship it to workers."""

    name = PLUGIN_NAME

    def __init__(
        self,
        endpoint: str | None,
        service_name: str = "dynask-engine",
        export_delay_ms: int = EXPORT_DELAY_MS,
    ) -> None:
        self.endpoint = endpoint
        self.service_name = service_name
        self.export_delay_ms = export_delay_ms
        self._provider: Any = None

    def setup(self, worker: Any = None, **kwargs: Any) -> None:
        self._provider = otlp_tracer_provider(
            self.endpoint, self.service_name, self.export_delay_ms
        )

    def teardown(self, worker: Any = None, **kwargs: Any) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # exports what is still batched
            self._provider = None

    @property
    def tracer(self) -> Tracer | None:
        return None if self._provider is None else self._provider.get_tracer("dynask.actors")

    def flush(self) -> bool:
        """Exports every finished span now (tests, shutdown)."""
        return True if self._provider is None else bool(self._provider.force_flush())


def worker_tracer() -> Tracer | None:
    """The tracer of this worker's ``TracingPlugin``; None without one (tracing off)."""
    from distributed import get_worker

    try:
        plugin = get_worker().plugins.get(PLUGIN_NAME)
    except ValueError:  # not inside a worker
        return None
    return plugin.tracer if isinstance(plugin, TracingPlugin) else None


@dataclass
class _Timing:
    parent: otel_context.Context
    prompt_tokens: int
    arrived_ns: int
    step_start_ns: int | None = None  # the step that produced the first token began
    first_token_ns: int | None = None
    tokens: int = 0


class EngineSpans:
    """The engine-side spans of one actor's traced requests (see the module docstring)."""

    def __init__(self, tracer: Tracer, actor: str) -> None:
        self.tracer = tracer
        self.actor = actor
        self._requests: dict[str, _Timing] = {}
        self._lock = threading.Lock()  # arrivals on the loop, steps on the engine thread
        self._last_step_ns = 0

    def arrived(self, request_id: str, traceparent: str | None, prompt_tokens: int) -> None:
        """A request reached the actor; only one with a valid traceparent is followed."""
        parent = context_from(traceparent)
        if parent is not None:
            with self._lock:
                self._requests[request_id] = _Timing(parent, prompt_tokens, time.time_ns())

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        """Engine thread, once per step: notes first tokens, writes finished requests."""
        now = time.time_ns()
        finished = []
        with self._lock:
            step_start, self._last_step_ns = self._last_step_ns, now
            for output in outputs:
                timing = self._requests.get(output.request_id)
                if timing is None:
                    continue
                timing.tokens += len(output.token_ids)
                if timing.first_token_ns is None and (output.token_ids or output.finished):
                    timing.first_token_ns = now
                    timing.step_start_ns = max(step_start, timing.arrived_ns)
                if output.finished:
                    finished.append((output, self._requests.pop(output.request_id)))
        for output, timing in finished:
            self._write(output, timing, now)

    def forget(self, request_id: str) -> None:
        """An aborted request that will produce no final delta."""
        with self._lock:
            self._requests.pop(request_id, None)

    def _write(self, output: RequestOutput, timing: _Timing, end_ns: int) -> None:
        attributes: dict[str, Any] = {
            "dynask.actor": self.actor,
            "dynask.request_id": output.request_id,
            "dynask.prompt_tokens": timing.prompt_tokens,
            "dynask.completion_tokens": timing.tokens,
            "dynask.finish_reason": str(output.finish_reason),
        }
        if output.usage is not None:
            attributes["dynask.cached_tokens"] = output.usage.cached_tokens
        root = self.tracer.start_span(
            "engine.request", timing.parent, start_time=timing.arrived_ns, attributes=attributes
        )
        inside = trace.set_span_in_context(root)
        first = timing.first_token_ns or end_ns
        step_start = timing.step_start_ns or timing.arrived_ns
        for name, start, end in (
            ("engine.queue", timing.arrived_ns, step_start),
            ("engine.prefill", step_start, first),
            ("engine.decode", first, end_ns),
        ):
            self.tracer.start_span(name, inside, start_time=start).end(end_time=end)
        root.end(end_time=end_ns)
