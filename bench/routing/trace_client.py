"""The client side of ``trace_replay.py``: send a trace slice at its own arrival times and
summarise what came back.

Design decisions:

- Open loop, as the trace was recorded: request ``i`` is sent at
  ``(timestamp_i - timestamp_0) / speedup`` seconds after the start, whether or not the
  earlier ones have answered. Each send is its own task, so a slow reply never delays the
  next arrival; how late each send left (``send_lag_s``) is recorded and reported, so a
  client that could not keep up shows.
- Prompts are token ids on ``/v1/completions`` (``trace.PromptBuilder``), ``max_tokens``
  the trace's output length with EOS ignored, streaming with usage in the last chunk.
  The KV hit rate is the engines' own count: ``usage.prompt_tokens_details.cached_tokens``
  over ``usage.prompt_tokens``, summed over the slice (None when the server reports none).
- Several endpoints (router replicas behind no load balancer): request ``i`` goes to
  endpoint ``i mod n``, round robin in trace order, so consecutive turns of one
  conversation land on different control planes: the case where they must share what
  they routed.
- Times are client-side (``bench.common.load.stream_completion``): TTFT from sending to the
  first chunk with a token, ITL between chunks, E2E from sending to ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.common.load import RequestRecord, stream_completion
from bench.routing.trace import PromptBuilder, TraceRequest

REQUEST_TIMEOUT_S = 600.0


def reset_prefix_caches(base_url: str, timeout_s: float = 60.0) -> None:
    """Empties every engine's prefix cache behind ``base_url`` (``POST
    /v1/engines/reset_prefix_cache``), so a phase on engines another phase used starts
    as cold as a fresh engine (Dynamo's side starts fresh per mode). Retries while an
    engine still holds the previous phase's requests; raises if it never resets."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = httpx.post(f"{base_url}/v1/engines/reset_prefix_cache", timeout=30.0)
        if answer.status_code == 200:
            return
        if answer.status_code != 409 or time.monotonic() > deadline:
            raise RuntimeError(f"cache reset at {base_url}: {answer.status_code} {answer.text}")
        time.sleep(0.5)


@dataclass(frozen=True)
class ReplayResult:
    """One replayed request: what was asked, when it left, what came back."""

    request: TraceRequest
    scheduled_s: float  # when it was due, from the replay's start
    send_lag_s: float  # how late it left
    record: RequestRecord

    @property
    def ok(self) -> bool:
        return self.record.failure(self.request.output_length) is None


def arrival_offsets(requests: Sequence[TraceRequest], speedup: float) -> list[float]:
    """Seconds after the start at which each request is due."""
    if not speedup > 0:
        raise ValueError(f"--speedup has value {speedup!r}; expected a number > 0")
    if not requests:
        return []
    first = requests[0].timestamp_ms
    return [(r.timestamp_ms - first) / 1000 / speedup for r in requests]


def request_body(
    model: str, prompt: list[int], request: TraceRequest, extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": request.output_length,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def replay(
    base_urls: str | Sequence[str],
    model: str,
    requests: Sequence[TraceRequest],
    *,
    speedup: float,
    builder: PromptBuilder,
    extra_body: dict[str, Any] | None = None,
) -> tuple[float, list[ReplayResult]]:
    """Sends every request at its (scaled) arrival time, to ``base_urls`` in turn; (wall
    seconds, results in order)."""
    urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
    if not urls:
        raise ValueError("replay needs at least one endpoint")
    offsets = arrival_offsets(requests, speedup)
    bodies = [
        request_body(model, builder.prompt(r), r, extra_body or {}) for r in requests
    ]  # built before the clock starts: prompt building is not the server's time
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout)
            )
            for url in urls
        ]
        start = time.perf_counter()

        async def one(index: int) -> ReplayResult:
            due = offsets[index]
            await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
            lag = time.perf_counter() - start - due
            record = await stream_completion(clients[index % len(clients)], bodies[index])
            return ReplayResult(requests[index], due, lag, record)

        results = await asyncio.gather(*(one(i) for i in range(len(requests))))
        return time.perf_counter() - start, list(results)


def _stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    array = np.asarray(values) * 1000
    return {
        "mean": float(array.mean()),
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
    }


def summarize(wall_s: float, results: Sequence[ReplayResult]) -> dict[str, Any]:
    """TTFT/ITL/E2E statistics (ms), rates, the engines' KV hit rate and the send lag."""
    ok = [r for r in results if r.ok]
    failures: dict[str, int] = {}
    for result in results:
        if (why := result.record.failure(result.request.output_length)) is not None:
            failures[why[:80]] = failures.get(why[:80], 0) + 1
    records = [r.record for r in ok]
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    lags = [r.send_lag_s for r in results]
    return {
        "requests": len(results),
        "requests_ok": len(ok),
        "failures": failures,
        "wall_s": wall_s,
        "req_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "output_tok_per_s": sum(r.completion_tokens or 0 for r in records) / wall_s,
        "ttft_ms": _stats_ms([r.ttft_s for r in records if r.ttft_s is not None]),
        "itl_ms": _stats_ms([g for r in records for g in r.gaps_s]),
        "e2e_ms": _stats_ms([r.done_s for r in records if r.done_s is not None]),
        "kv_hit_rate": kv_hit_rate(results),
        "prompt_tokens": sum(prompt),
        "send_lag_ms": {"p50": _stats_ms(lags)["p50"], "max": max(lags, default=0) * 1000},
        # Per request, in trace order: [prompt tokens, cached tokens, TTFT ms] (None: failed).
        "per_request": [_brief(r) for r in results],
    }


def kv_hit_rate(results: Sequence[ReplayResult]) -> float | None:
    """Cached over prompt tokens of the requests served, as their engines reported them."""
    records = [r.record for r in results if r.ok]
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    cached = [r.cached_tokens for r in records if r.cached_tokens is not None]
    return sum(cached) / sum(prompt) if cached and prompt else None


def _brief(result: ReplayResult) -> list[Any] | None:
    record = result.record
    if not result.ok or record.ttft_s is None:
        return None
    return [record.prompt_tokens, record.cached_tokens, round(record.ttft_s * 1000, 1)]
