"""The engine side of tracing: traceparents, the request bytes, the engine's spans.

Exact values: the W3C header round trip, the packed request with and without a trace,
and the queue/prefill/decode boundaries ``EngineSpans`` draws from step times (a
scripted clock, the SDK's in-memory exporter).
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.runtime import tracing
from dynask.actors.runtime.token_stream import pack_request, read_request, unpack_request

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traceparent_names_its_span_and_a_malformed_one_names_none() -> None:
    ctx = tracing.context_from(PARENT)
    assert ctx is not None
    span = tracing.trace.get_current_span(ctx)
    assert tracing.traceparent_of(span) == PARENT
    assert tracing.context_from("00-zz-11-01") is None
    assert tracing.context_from(None) is None
    assert tracing.traceparent_of(INVALID_SPAN) is None


def test_the_request_bytes_carry_a_traceparent_only_when_traced() -> None:
    params = {"max_tokens": 2}
    traced = pack_request("r-1", [5, 6], params, PARENT)
    assert read_request(traced) == ("r-1", [5, 6], params, PARENT)
    plain = pack_request("r-1", [5, 6], params)
    assert read_request(plain) == ("r-1", [5, 6], params, None)
    assert unpack_request(traced) == unpack_request(plain) == ("r-1", [5, 6], params)
    assert len(traced) - len(plain) == 2 + 2 + len(PARENT)  # the key "t"; str8 header, text


def test_engine_spans_split_queue_prefill_and_decode_at_step_boundaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([100, 250, 400, 700, 900])  # ns: arrival, steps
    monkeypatch.setattr(tracing.time, "time_ns", lambda: next(clock))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = tracing.EngineSpans(provider.get_tracer("t"), "mock-0")

    spans.arrived("r", PARENT, 7)  # 100
    spans.arrived("untraced", None, 3)  # not followed: no clock read
    other = RequestOutput("busy", "x", (1,))
    spans.on_outputs([other])  # 250: a step of another request ends
    spans.on_outputs([RequestOutput("r", "a", (9,))])  # 400: r's first token
    spans.on_outputs([RequestOutput("r", "b", (8,))])  # 700
    usage = Usage(7, 3, 4)
    spans.on_outputs([RequestOutput("r", "c", (7,), FinishReason.LENGTH, usage=usage)])  # 900

    got = {s.name: s for s in exporter.get_finished_spans()}
    assert {n: (s.start_time, s.end_time) for n, s in got.items()} == {
        "engine.queue": (100, 250),
        "engine.prefill": (250, 400),
        "engine.decode": (400, 900),
        "engine.request": (100, 900),
    }
    root = got["engine.request"]
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert {got[n].parent.span_id for n in ("engine.queue", "engine.prefill", "engine.decode")} == {
        root.context.span_id
    }
    assert dict(root.attributes) == {
        "dynask.actor": "mock-0",
        "dynask.request_id": "r",
        "dynask.prompt_tokens": 7,
        "dynask.completion_tokens": 3,
        "dynask.finish_reason": "length",
        "dynask.cached_tokens": 4,
    }


def test_an_aborted_request_is_forgotten() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = tracing.EngineSpans(provider.get_tracer("t"), "mock-0")
    spans.arrived("r", PARENT, 2)
    spans.forget("r")
    spans.on_outputs([RequestOutput("r", "", (), FinishReason.ABORT)])
    assert exporter.get_finished_spans() == ()
