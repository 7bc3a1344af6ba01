"""A closed-loop streaming load generator for OpenAI-compatible ``/v1/completions``.

``concurrency`` clients share one list of prompts: each takes the next prompt, sends a
streaming request (``max_tokens`` tokens, EOS ignored, usage in the last chunk), reads
the SSE stream to ``[DONE]`` and only then sends its next request.

Timing is client-side, from the arrival of SSE chunks (``time.perf_counter``):

- TTFT: from sending the request until the first chunk with a choice arrives.
- ITL: the gap between consecutive chunks with a choice. A server may put several
  tokens in one chunk when it falls behind the engine, so ``tokens_per_chunk`` (output
  tokens / content chunks) is reported beside it; above 1, ITL is per chunk, not token.

Only lines that may hold usage or an error are parsed as JSON, which keeps the client's
own CPU cost per chunk low (it shares the machine with the server it measures).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

_WORD_TEXT = (
    "river mountain garden window silver morning quiet engine letter market bridge winter "
    "yellow station forest number simple travel kitchen doctor planet summer music paper "
    "orange island coffee family pencil ocean shadow button castle rabbit candle folder "
    "signal harbor wooden library camera thunder velvet garage meadow lantern puzzle "
    "compass blanket marble tunnel feather cottage circus pepper violin anchor glacier"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class LoadSpec:
    """One measured window: how many clients, how many requests, what each asks for."""

    concurrency: int
    max_tokens: int
    timeout_s: float


@dataclass
class RequestRecord:
    """What one client saw of one request."""

    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    content_chunks: int = 0
    completion_tokens: int | None = None  # from the usage chunk
    prompt_tokens: int | None = None  # as the server counted them
    cached_tokens: int | None = None  # prompt tokens the engine took from its prefix cache
    done: bool = False  # "data: [DONE]" arrived
    done_s: float | None = None  # from sending until "data: [DONE]" arrived
    end_s: float | None = None  # from sending until the response body ended
    new_connection: bool = False  # the client opened a TCP connection for this request
    error: str | None = None

    async def trace(self, event: str, _info: dict[str, Any]) -> None:
        """httpx's trace hook: notes a new connection (a pooled one was not reused)."""
        if event == "connection.connect_tcp.complete":
            self.new_connection = True

    def failure(self, max_tokens: int) -> str | None:
        """Why this request does not count as complete; None when it does."""
        if self.error is not None:
            return self.error
        if not self.done:
            return "stream ended without [DONE]"
        if self.completion_tokens != max_tokens:
            return f"completion_tokens {self.completion_tokens} != {max_tokens}"
        return None


@dataclass(frozen=True)
class LoadSummary:
    """Rates and latency percentiles of one measured window."""

    requests_ok: int
    requests_failed: int
    failures: dict[str, int]
    wall_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    ttft_max_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    itl_max_ms: float | None
    itl_max_after_chunk: int | None  # how many content chunks came before the longest gap
    tokens_per_chunk: float | None
    prompt_tokens_mean: float | None  # as the server counted them
    e2e_p50_ms: float | None  # sending → "data: [DONE]"
    done_to_end_p50_ms: float | None  # "data: [DONE]" → the end of the response body
    new_connections: int  # TCP connections the client opened (all requests, failed too)


def build_prompts(tokenizer: Any, count: int, tokens: int, tag: str) -> list[str]:
    """``count`` distinct text prompts of about ``tokens`` tokens each.

    Each starts with its own tag and index, so no two share even their first KV block
    (no prefix-cache hits between requests), then random common words, cut at
    ``tokens`` tokens by the tokenizer and decoded back to text.
    """
    rng = random.Random(tag)
    prompts = []
    for index in range(count):
        words = [rng.choice(WORDS) for _ in range(tokens + 16)]
        ids = tokenizer.encode(f"Request {tag}-{index}: " + " ".join(words))[:tokens]
        prompts.append(tokenizer.decode(ids))
    return prompts


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def new_client(spec: LoadSpec, base_url: str) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency
    )
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=spec.timeout_s)


async def run_load(
    client: httpx.AsyncClient, spec: LoadSpec, model: str, prompts: Sequence[str]
) -> tuple[float, list[RequestRecord]]:
    """Sends every prompt once with ``spec.concurrency`` clients; (wall seconds, records)."""
    queue = iter(prompts)
    records: list[RequestRecord] = []

    async def one_client() -> None:
        for prompt in queue:  # a shared iterator: each prompt goes to exactly one client
            body = completion_body(model, prompt, spec.max_tokens)
            records.append(await stream_completion(client, body))

    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(spec.concurrency)))
    return time.perf_counter() - start, records


async def stream_completion(client: httpx.AsyncClient, body: dict[str, Any]) -> RequestRecord:
    """Sends one streaming request and reads it to the end."""
    record = RequestRecord()
    start = last = time.perf_counter()
    try:
        trace = {"trace": record.trace}
        async with client.stream(
            "POST", "/v1/completions", json=body, extensions=trace
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:120]}"
                return record
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if _read_line(record, line):
                    if record.ttft_s is None:
                        record.ttft_s = now - start
                    else:
                        record.gaps_s.append(now - last)
                    last = now
                elif record.done and record.done_s is None:
                    record.done_s = now - start
        record.end_s = time.perf_counter() - start
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:160]
    return record


def _read_line(record: RequestRecord, line: str) -> bool:
    """Updates ``record`` from one SSE line; True when the line is a content chunk."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if data == "[DONE]":
        record.done = True
        return False
    if '"usage"' not in data and '"error"' not in data:
        record.content_chunks += 1
        return True
    event = json.loads(data)
    if "error" in event:
        record.error = f"in-stream error: {str(event['error'])[:120]}"
        return False
    if usage := event.get("usage"):
        record.completion_tokens = usage["completion_tokens"]
        record.prompt_tokens = usage["prompt_tokens"]
        record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if event.get("choices"):
        record.content_chunks += 1
        return True
    return False


def summarize(wall_s: float, records: list[RequestRecord], max_tokens: int) -> LoadSummary:
    """Rates over the window and percentiles over the requests that completed."""
    ok = [r for r in records if r.failure(max_tokens) is None]
    failures = Counter(f for r in records if (f := r.failure(max_tokens)) is not None)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [g for r in ok for g in r.gaps_s]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    chunks = sum(r.content_chunks for r in ok)
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return LoadSummary(
        requests_ok=len(ok),
        requests_failed=len(records) - len(ok),
        failures=dict(failures.most_common(5)),
        wall_s=wall_s,
        req_per_s=len(ok) / wall_s,
        output_tok_per_s=tokens / wall_s,
        ttft_p50_ms=_percentile_ms(ttfts, 50),
        ttft_p99_ms=_percentile_ms(ttfts, 99),
        ttft_max_ms=_percentile_ms(ttfts, 100),
        itl_p50_ms=_percentile_ms(gaps, 50),
        itl_p99_ms=_percentile_ms(gaps, 99),
        itl_max_ms=_percentile_ms(gaps, 100),
        itl_max_after_chunk=_longest_gap_position(ok),
        tokens_per_chunk=tokens / chunks if chunks else None,
        prompt_tokens_mean=float(np.mean(prompt_tokens)) if prompt_tokens else None,
        e2e_p50_ms=_percentile_ms([r.done_s for r in ok if r.done_s is not None], 50),
        new_connections=sum(r.new_connection for r in records),
        done_to_end_p50_ms=_percentile_ms(
            [r.end_s - r.done_s for r in ok if r.end_s is not None and r.done_s is not None], 50
        ),
    )


def _longest_gap_position(records: list[RequestRecord]) -> int | None:
    """1 when the longest gap of all requests followed their first chunk, and so on."""
    positions = [(g, i + 1) for r in records for i, g in enumerate(r.gaps_s)]
    return max(positions)[1] if positions else None


def _percentile_ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None
