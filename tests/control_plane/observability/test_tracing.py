"""OpenTelemetry traces of requests, as an operator's collector receives them.

A real in-process Dask cluster with engine actors, the control plane under uvicorn, the
official ``openai`` client sending a W3C ``traceparent``. The control plane's spans go
to the SDK's in-memory exporter; the engine actors' spans leave the worker through its
``TracingPlugin`` and the real OTLP/HTTP exporter to a collector on a local port
(``bench.common.otlp_receiver``). Every test asserts the whole tree (names and parents)
and the spans' attributes exactly: one trace, rooted at the client's span.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from bench.common.otlp_receiver import OtlpReceiver, ReceivedSpan
from dynask.actors.runtime.tracing import TracingPlugin
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    serving_stack,
    tokens,
)

pytestmark = pytest.mark.slow  # starts a cluster with engine actors

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
ENGINE_PHASES = ["engine.queue", "engine.prefill", "engine.decode"]


@pytest.fixture
def collector() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def _tracer(exporter: InMemorySpanExporter) -> Any:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


@asynccontextmanager
async def traced_stack(
    folder: Path,
    collector: OtlpReceiver,
    exporter: InMemorySpanExporter,
    engine: str = "mocker",
    engine_args: dict[str, Any] | None = None,
    **stack_options: Any,
) -> AsyncIterator[Stack]:
    plugin = TracingPlugin(collector.url, "engine-test", export_delay_ms=50)
    async with (
        cluster_with_actors(folder, 2, engine, engine_args, worker_plugins=[plugin]) as proxies,
        serving_stack(
            proxies, tracer=_tracer(exporter), headers={"traceparent": TRACEPARENT}, **stack_options
        ) as stack,
    ):
        yield stack


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def _parent(span: ReadableSpan) -> str:
    return _hex(span.parent.span_id) if span.parent is not None else ""


async def _control_plane_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The control plane's finished spans of the client's trace once ``count`` are (the
    HTTP span ends after the body's last byte, which the client may read first)."""
    for _ in range(200):
        spans = [
            s for s in exporter.get_finished_spans() if s.context.trace_id == int(TRACE_ID, 16)
        ]
        if len(spans) >= count:
            return spans
        await asyncio.sleep(0.02)
    raise AssertionError([s.name for s in exporter.get_finished_spans()])


def _by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        found.setdefault(span.name, []).append(span)
    return found


def _engine_tree(received: list[ReceivedSpan]) -> dict[str, str]:
    """Engine span name -> its parent's name among the engine spans ("" otherwise)."""
    names = {s.span_id: s.name for s in received}
    return {s.name: names.get(s.parent_span_id, "") for s in received}


def _assert_engine_request(
    received: list[ReceivedSpan], parent: str, attributes: dict[str, Any]
) -> None:
    (request,) = [s for s in received if s.name == "engine.request"]
    assert request.parent_span_id == parent
    assert request.attributes == attributes
    assert request.service == "engine-test"
    phases = sorted(
        (s for s in received if s.parent_span_id == request.span_id), key=lambda s: s.start_ns
    )
    assert [s.name for s in phases] == ENGINE_PHASES
    queue, prefill, decode = phases
    assert request.start_ns == queue.start_ns <= queue.end_ns == prefill.start_ns
    assert prefill.start_ns <= prefill.end_ns == decode.start_ns <= decode.end_ns == request.end_ns


def test_one_trace_from_the_client_span_to_the_engine_steps(
    tiny_llama_folder: Path, collector: OtlpReceiver, exporter: InMemorySpanExporter
) -> None:
    prompt = tokens(seed=1, blocks=2, extra=3)

    async def main() -> tuple[Any, dict[str, Any]]:
        async with traced_stack(tiny_llama_folder, collector, exporter) as stack:
            reply = await stack.complete(prompt, max_tokens=4)
            return reply, (await stack.decisions(1))[0]

    reply, decision = asyncio.run(main())
    spans = _by_name(asyncio.run(_control_plane_spans(exporter, 4)))
    assert sorted(spans) == ["POST /v1/completions", "generate", "prepare", "route"]
    (http,), (prepare,), (route,), (generate,) = (
        spans[name] for name in ("POST /v1/completions", "prepare", "route", "generate")
    )
    assert {s.context.trace_id for group in spans.values() for s in group} == {int(TRACE_ID, 16)}
    assert _parent(http) == CLIENT_SPAN
    assert [_parent(s) for s in (prepare, route, generate)] == [_hex(http.context.span_id)] * 3

    request_id = reply.id
    assert dict(http.attributes or {}) == {
        "http.request.method": "POST",
        "url.path": "/v1/completions",
        "http.response.status_code": 200,
    }
    assert dict(prepare.attributes or {}) == {
        "dynask.model": MODEL,
        "dynask.request_id": request_id,
        "dynask.prompt_tokens": 35,
        "dynask.max_tokens": 4,
    }
    winner = next(c for c in decision["candidates"] if c["actor"] == decision["winner"])
    assert dict(route.attributes or {}) == {
        "dynask.routing.mode": "kv",
        "dynask.routing.actor": decision["winner"],
        "dynask.routing.prompt_blocks": 2,
        "dynask.routing.overlap_blocks": 0,
        "dynask.routing.uncached_blocks": 2,
        "dynask.routing.prefill_blocks": winner["prefill_blocks"],
        "dynask.routing.decode_blocks": winner["decode_blocks"],
        "dynask.routing.cost": winner["cost"],
        "dynask.routing.compute_us": decision["compute_us"],
        "dynask.routing.candidates": ("mock-0", "mock-1"),
        "dynask.routing.candidate_costs": tuple(float(c["cost"]) for c in decision["candidates"]),
        "dynask.routing.candidate_overlap_blocks": (0, 0),
        "dynask.remote_prefill": False,
    }
    assert dict(generate.attributes or {}) == {
        "dynask.actor": decision["winner"],
        "dynask.request_id": request_id,
        "dynask.attempt": 0,
        "dynask.prompt_tokens": 35,
        "dynask.finish_reason": "length",
        "dynask.tokens_sent": 4,
    }
    assert [e.name for e in generate.events] == ["first_token"]

    received = collector.wait_for(4)
    assert {s.trace_id for s in received} == {TRACE_ID}
    assert _engine_tree(received) == {
        "engine.request": "",
        "engine.queue": "engine.request",
        "engine.prefill": "engine.request",
        "engine.decode": "engine.request",
    }
    _assert_engine_request(
        received,
        _hex(generate.context.span_id),
        {
            "dynask.actor": decision["winner"],
            "dynask.request_id": request_id,
            "dynask.prompt_tokens": 35,
            "dynask.completion_tokens": 4,
            "dynask.finish_reason": "length",
            "dynask.cached_tokens": 0,
        },
    )


def test_a_disaggregated_request_traces_its_remote_prefill_and_kv_transfer(
    tiny_llama_folder: Path, collector: OtlpReceiver, exporter: InMemorySpanExporter
) -> None:
    prompt = tokens(seed=2, blocks=2, extra=8)  # 40 tokens: blocks of 8
    moved = (len(prompt) - 1) // 8  # the full blocks before the last token (it is recomputed)
    disagg = DisaggOptions(min_remote_prefill_tokens=16)
    llama = {"block_size": 8, "num_kv_blocks": 256}

    async def main() -> Any:
        async with traced_stack(
            tiny_llama_folder,
            collector,
            exporter,
            "torch",
            llama,
            disagg=disagg,
            roles=["prefill", "decode"],
        ) as stack:
            reply = await stack.complete(prompt, max_tokens=3, temperature=0.0)
            await stack.service.disagg.wait_idle()
            return reply

    reply = asyncio.run(main())
    spans = _by_name(asyncio.run(_control_plane_spans(exporter, 6)))
    assert sorted(spans) == [
        "POST /v1/completions",
        "generate",
        "kv_handover",
        "prepare",
        "remote_prefill",
        "route",
    ]
    (generate,), (handover,), (prefill,) = (
        spans[n] for n in ("generate", "kv_handover", "remote_prefill")
    )
    attempt = _hex(generate.context.span_id)
    assert [_parent(handover), _parent(prefill)] == [attempt, attempt]
    assert dict(handover.attributes or {}) == {
        "dynask.decode_actor": "mock-1",
        "dynask.remote_prefill": True,
    }
    assert dict(prefill.attributes or {}) == {
        "dynask.prefill_actor": "mock-0",
        "dynask.decode_actor": "mock-1",
        "dynask.kv_blocks_moved": moved,
    }
    assert dict(spans["route"][0].attributes or {})["dynask.remote_prefill"] is True

    received = collector.wait_for(6)
    assert _engine_tree(received) == {
        "engine.kv_import_prepare": "",
        "engine.remote_prefill": "",
        "engine.request": "",
        "engine.queue": "engine.request",
        "engine.prefill": "engine.request",
        "engine.decode": "engine.request",
    }
    by_name = {s.name: s for s in received}
    assert by_name["engine.kv_import_prepare"].attributes == {
        "dynask.actor": "mock-1",
        "dynask.remote_prefill": True,
    }
    assert by_name["engine.remote_prefill"].attributes == {
        "dynask.actor": "mock-0",
        "dynask.kv_blocks_sent": moved,
    }
    assert {
        by_name[n].parent_span_id for n in ("engine.kv_import_prepare", "engine.remote_prefill")
    } == {attempt}
    _assert_engine_request(
        received,
        attempt,
        {
            "dynask.actor": "mock-1",
            "dynask.request_id": reply.id,
            "dynask.prompt_tokens": 40,
            "dynask.completion_tokens": 3,
            "dynask.finish_reason": "length",
            "dynask.cached_tokens": moved * 8,
        },
    )


def test_a_migrated_request_shows_each_attempt_and_the_hop(
    tiny_llama_folder: Path, collector: OtlpReceiver, exporter: InMemorySpanExporter
) -> None:
    prompt = tokens(seed=3, blocks=1, extra=4)
    slow = {"speedup_ratio": 1.0, "num_kv_blocks": 256}  # ~6 ms a step: time to move

    async def main() -> tuple[str, str, int]:
        async with traced_stack(tiny_llama_folder, collector, exporter, "mocker", slow) as stack:
            stream = await stack.openai.completions.create(
                model=MODEL, prompt=prompt, max_tokens=48, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            chunks = 0
            async for chunk in stream:  # noqa: B007 (its id, after the loop)
                chunks += 1
                if chunks == 3:
                    victim = max(stack.handles, key=lambda h: h.in_flight)
                    victim.declare_lost("test", "declared lost by the test")
            request_id = chunk.id
            return request_id, victim.name, chunks

    request_id, victim, _ = asyncio.run(main())
    other = "mock-1" if victim == "mock-0" else "mock-0"
    spans = _by_name(asyncio.run(_control_plane_spans(exporter, 7)))
    assert {name: len(group) for name, group in spans.items()} == {
        "POST /v1/completions": 1,
        "prepare": 1,
        "route": 2,
        "generate": 2,
        "migrate": 1,
    }
    (http,), (migrate,) = spans["POST /v1/completions"], spans["migrate"]
    first, second = spans["generate"]
    root = _hex(http.context.span_id)
    assert [_parent(s) for s in (first, migrate, second)] == [root] * 3
    assert [_parent(s) for s in spans["route"]] == [root, _hex(migrate.context.span_id)]
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["dynask.actor"] == victim
    assert (first.attributes or {})["dynask.attempt"] == 0
    sent = (first.attributes or {})["dynask.tokens_sent"]
    assert dict(migrate.attributes or {}) == {
        "dynask.migration.from_actor": victim,
        "dynask.migration.move": 1,
        "dynask.migration.tokens_sent": sent,
        "dynask.migration.to_actor": other,
    }
    assert dict(second.attributes or {}) == {
        "dynask.actor": other,
        "dynask.request_id": f"{request_id}-m1",
        "dynask.attempt": 1,
        "dynask.prompt_tokens": 20 + sent,
        "dynask.finish_reason": "length",
        "dynask.tokens_sent": 48,
    }
    # The moved attempt's engine spans hang under the second attempt.
    received = collector.wait_for(4)
    moved = [s for s in received if s.attributes.get("dynask.request_id") == f"{request_id}-m1"]
    assert [(s.name, s.parent_span_id) for s in moved] == [
        ("engine.request", _hex(second.context.span_id))
    ]
