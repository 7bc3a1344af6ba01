"""The client side of ``routing.py``: the prefix-heavy workload, the streaming client, and
the measurements of one routing mode (a ``Phase``, run in rounds) summarised as a ``Row``.

Timing is client-side: TTFT from sending a request to the first chunk with a token. Only
lines that may hold usage or an error are parsed as JSON (the client shares the cores
with the server it measures). The KV hit rate comes from each reply's usage
(``prompt_tokens_details.cached_tokens``, the engine's own count).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from bench.common.load import RequestRecord, stream_completion

MODEL = "bench"  # routing_server.MODEL
VOCAB = (100, 40_000)
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Workload:
    groups: int
    system_tokens: int
    conversations: int
    turns: int
    user_tokens: int
    reply_tokens: int
    max_tokens: int
    concurrency: int


# ---- the workload ---------------------------------------------------------------------------


def conversations(workload: Workload, seed: int) -> list[list[list[int]]]:
    """Per conversation, the prompt of each turn (token ids)."""
    rng = random.Random(seed)

    def fresh(count: int) -> list[int]:
        return [rng.randrange(*VOCAB) for _ in range(count)]

    systems = [fresh(workload.system_tokens) for _ in range(workload.groups)]
    result = []
    for index in range(workload.conversations):
        history = list(systems[index % workload.groups])
        turns = []
        for _ in range(workload.turns):
            history += fresh(workload.user_tokens)
            turns.append(list(history))
            history += fresh(workload.reply_tokens)  # the reply, as the client resends it
        result.append(turns)
    rng.shuffle(result)
    return result


# ---- the client -----------------------------------------------------------------------------


def request_body(prompt: list[int], max_tokens: int, mode: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "router_mode": mode,
    }


# ---- one phase: one mode ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    scenario: str
    mode: str
    requests_ok: int
    requests_failed: int
    failures: list[str]
    wall_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    ttft_mean_ms: float | None
    kv_hit_rate: float | None
    route_us_p50: float | None
    route_us_p99: float | None
    winner_overlap_mean_blocks: float | None
    winner_busy_share: float | None  # decisions whose winner had requests in flight
    load_avg_1m: float  # mean over the phase's rounds
    ttft_by_turn_p50_ms: list[float | None] = field(default_factory=list)


@dataclass
class Phase:
    """One mode's prompts and what was measured of them, over one or more rounds."""

    mode: str
    conversations: list[list[list[int]]]
    records: list[tuple[int, RequestRecord]] = field(default_factory=list)  # (turn, record)
    wall_s: float = 0.0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    load_avg_1m: list[float] = field(default_factory=list)

    def round_slice(self, round_index: int, rounds: int) -> list[list[list[int]]]:
        """The conversations of one round (every ``rounds``-th one)."""
        return self.conversations[round_index::rounds]


async def run_round(
    base_url: str, workload: Workload, phase: Phase, convs: list[list[list[int]]]
) -> None:
    """Sends ``convs`` in ``phase.mode`` with the workload's concurrency; records into it."""
    records: list[tuple[int, RequestRecord]] = []
    limits = httpx.Limits(max_connections=workload.concurrency + 2)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=REQUEST_TIMEOUT_S
    ) as client:
        queue = iter(convs)

        async def user() -> None:
            for conversation in queue:  # shared: each conversation goes to one client
                for turn, prompt in enumerate(conversation):
                    body = request_body(prompt, workload.max_tokens, phase.mode)
                    records.append((turn, await stream_completion(client, body)))

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(workload.concurrency)))
        phase.wall_s += time.perf_counter() - start
        phase.decisions += await _decisions(client, len(records), phase.mode)
    phase.records += records
    phase.load_avg_1m.append(_load1())


async def _decisions(client: httpx.AsyncClient, count: int, mode: str) -> list[dict[str, Any]]:
    limit = min(count, 1000)  # the decision log keeps the last 1000
    response = await client.get("/v1/routing/decisions", params={"limit": limit})
    response.raise_for_status()
    return [d for d in response.json()["data"] if d["mode"] == mode]


def summarize(scenario: str, workload: Workload, phase: Phase) -> Row:
    """The phase's rates and percentiles over the requests that completed."""
    max_tokens = workload.max_tokens
    ok = [(t, r) for t, r in phase.records if r.failure(max_tokens) is None]
    failures = [f for _, r in phase.records if (f := r.failure(max_tokens)) is not None]
    ttfts = [r.ttft_s for _, r in ok if r.ttft_s is not None]
    prompt = sum(r.prompt_tokens or 0 for _, r in ok)
    by_turn = [
        _pct([r.ttft_s for t, r in ok if t == turn and r.ttft_s is not None], 50, 1000)
        for turn in range(workload.turns)
    ]
    decisions = phase.decisions
    route_us = [d["compute_us"] for d in decisions]
    # Only kv mode asks the index; the other modes report every overlap as 0.
    overlaps = [
        c["overlap_blocks"] for d in decisions for c in d["candidates"] if c["actor"] == d["winner"]
    ]
    winners = [c for d in decisions for c in d["candidates"] if c["actor"] == d["winner"]]
    busy = [c["prefill_blocks"] + c["decode_blocks"] > 0 for c in winners]
    wall_s = phase.wall_s
    return Row(
        scenario=scenario,
        mode=phase.mode,
        requests_ok=len(ok),
        requests_failed=len(failures),
        failures=sorted(set(failures))[:5],
        wall_s=wall_s,
        req_per_s=len(ok) / wall_s,
        output_tok_per_s=sum(r.completion_tokens or 0 for _, r in ok) / wall_s,
        ttft_p50_ms=_pct(ttfts, 50, 1000),
        ttft_p99_ms=_pct(ttfts, 99, 1000),
        ttft_mean_ms=float(np.mean(ttfts)) * 1000 if ttfts else None,
        kv_hit_rate=sum(r.cached_tokens or 0 for _, r in ok) / prompt if prompt else None,
        route_us_p50=_pct(route_us, 50),
        route_us_p99=_pct(route_us, 99),
        winner_overlap_mean_blocks=(
            float(np.mean(overlaps)) if overlaps and phase.mode == "kv" else None
        ),
        winner_busy_share=float(np.mean(busy)) if busy else None,
        load_avg_1m=float(np.mean(phase.load_avg_1m)),
        ttft_by_turn_p50_ms=by_turn,
    )


def _pct(values: list[float], q: float, scale: float = 1.0) -> float | None:
    return float(np.percentile(values, q)) * scale if values else None


def _load1() -> float:
    with open("/proc/loadavg") as file:
        return float(file.read().split()[0])
