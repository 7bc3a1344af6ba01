"""Benchmark of KV-aware routing: the same prefix-heavy workload under kv, round-robin and
random routing, in the same run, against the same engines.

Workload (token-id prompts on ``/v1/completions``, so blocks are exact): ``groups``
system prompts of ``system_tokens`` tokens; ``conversations`` multi-turn conversations,
each under one group's system prompt, of ``turns`` turns. Turn k resends the system
prompt and the whole history (every earlier user message of ``user_tokens`` and reply of
``reply_tokens`` tokens) plus a new user message; the replies are fixed random tokens, as
a client resends what it received. ``concurrency`` clients each take the next
conversation and send its turns one after another (a turn waits for the previous reply),
streaming, ``max_tokens`` tokens with EOS ignored. Every mode gets its own fresh prompts
(another seed), so no mode profits from another's cache. The modes take turns in
``rounds``, each round with a share of every mode's conversations and in another order,
so a shared machine that gets busier or quieter during the run weighs on all of them.

The mode is chosen per request (the ``router_mode`` body field) on ONE control plane
(``routing_server.py``, its own process; engine actors on local Dask worker processes).

Scenarios:

* ``mocker``: 32 mocker actors (8 per worker process) with the mocker's timing model at
  ``speedup_ratio`` 1: prefill time grows with the step's uncached prompt tokens (cached
  blocks are skipped), decode steps take 5.7 ms plus a per-block term.
* ``torch``: 4 built-in engine actors (one per worker process, one torch thread each)
  with the bundled SmolLM2-135M-Instruct, on this machine's CPU.

Measured per mode, client side: TTFT p50/p99 (request sent -> first token chunk),
requests/s and output tokens/s over the phase, KV hit rate (cached prompt tokens /
prompt tokens, from each reply's usage), and from ``/v1/routing/decisions`` the router's
own time per decision and the chosen actors' mean overlap. Goals from the issue: TTFT
p50 at least 3x better than round-robin on ``mocker`` and at least 2x on ``torch``.

    .venv/bin/python -m bench.routing.prefix_reuse       # both scenarios, a few minutes
    .venv/bin/python -m bench.routing.prefix_reuse --scenarios mocker --quick

It prints a table and writes JSON to ``bench/results/routing.json`` (``--out``). The
workload, the client and one phase are in ``routing_load.py``; the control plane it
starts is ``routing_server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common.load import stream_completion
from bench.common.processes import free_port, spawned, wait_until_ready
from bench.common.report import code_version, machine_facts, write_json
from bench.routing.load import (
    REQUEST_TIMEOUT_S,
    VOCAB,
    Phase,
    Row,
    Workload,
    conversations,
    request_body,
    run_round,
    summarize,
)

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
DEFAULT_OUT = REPO / "bench" / "results" / "routing.json"
MODES = ("kv", "round-robin", "random")
READY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Scenario:
    name: str
    engine: str
    engine_args: dict[str, Any]
    actors: int
    workers: int
    workload: Workload
    rounds: int  # the modes take turns, each with this share of its conversations
    overlap_weight: float  # --kv-overlap-weight of the control plane
    goal_ttft_ratio: float  # round-robin TTFT p50 / kv TTFT p50, at least


SCENARIOS = {
    "mocker": Scenario(
        "mocker",
        "mocker",
        {"speedup_ratio": 1.0, "num_kv_blocks": 4096},
        actors=32,
        workers=4,
        workload=Workload(16, 1024, 96, 4, 128, 64, 32, 16),
        rounds=2,
        overlap_weight=1.0,
        goal_ttft_ratio=3.0,
    ),
    "torch": Scenario(
        "torch",
        "torch",
        {"kv_cache_gib": 0.5},
        actors=4,
        workers=4,
        workload=Workload(8, 320, 12, 5, 64, 64, 8, 2),
        rounds=6,  # short rounds: this scenario feels every other process on the machine
        overlap_weight=1.0,
        goal_ttft_ratio=2.0,
    ),
}


def quick(scenario: Scenario) -> Scenario:
    """A smoke-test size: a quarter of the conversations."""
    w = scenario.workload
    smaller = Workload(**{**asdict(w), "conversations": max(w.concurrency, w.conversations // 4)})
    return Scenario(**{**asdict(scenario), "workload": smaller})


# ---- a scenario: one server, every mode ---------------------------------------------------------


async def warm_up(base_url: str, scenario: Scenario) -> None:
    """One short request per actor (first-call costs out of the measured phases)."""
    rng = random.Random("warm-up")
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(scenario.actors):
            prompt = [rng.randrange(*VOCAB) for _ in range(64)]
            record = await stream_completion(client, request_body(prompt, 2, "round-robin"))
            if record.error is not None:
                raise RuntimeError(f"warm-up request failed: {record.error}")


def run_scenario(scenario: Scenario, workdir: Path) -> list[Row]:
    port = free_port()
    argv = [
        str(PYTHON),
        "-m",
        "bench.routing.server",
        "--engine",
        scenario.engine,
        "--engine-args",
        json.dumps(scenario.engine_args),
        "--actors",
        str(scenario.actors),
        "--workers",
        str(scenario.workers),
        "--port",
        str(port),
        "--kv-overlap-weight",
        str(scenario.overlap_weight),
    ]
    base_url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # `-m bench.routing.server` from any cwd
    with spawned(f"routing-server-{scenario.name}", argv, workdir, env) as server:
        started = time.perf_counter()
        wait_until_ready(f"{base_url}/health", '"ready"', READY_TIMEOUT_S, [server])
        print(
            f"{scenario.name}: {scenario.actors} actors ready in "
            f"{time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        asyncio.run(warm_up(base_url, scenario))
        workload = scenario.workload
        phases = [
            Phase(mode, conversations(workload, seed=1000 * (index + 1)))
            for index, mode in enumerate(MODES)
        ]
        for round_index in range(scenario.rounds):
            # Modes take turns, each round in another order: a machine that gets busier
            # or quieter during the run slows every mode alike.
            shift = round_index % len(phases)
            for phase in phases[shift:] + phases[:shift]:
                convs = phase.round_slice(round_index, scenario.rounds)
                asyncio.run(run_round(base_url, workload, phase, convs))
        rows = [summarize(scenario.name, workload, phase) for phase in phases]
        for row in rows:
            print(format_row(row), file=sys.stderr)
        return rows


# ---- report --------------------------------------------------------------------------------------

HEADER = (
    f"{'scenario':<8} {'mode':<12} {'ok':>4} {'fail':>4} {'req/s':>6} {'tok/s':>7} "
    f"{'TTFT p50':>9} {'TTFT p99':>9} {'hit rate':>8} {'route µs':>8} {'overlap':>7} {'load1':>5}"
)


def format_row(row: Row) -> str:
    return (
        f"{row.scenario:<8} {row.mode:<12} {row.requests_ok:>4} {row.requests_failed:>4} "
        f"{row.req_per_s:>6.2f} {row.output_tok_per_s:>7.1f} {_ms(row.ttft_p50_ms):>9} "
        f"{_ms(row.ttft_p99_ms):>9} {_frac(row.kv_hit_rate):>8} "
        f"{_num(row.route_us_p50):>8} {_num(row.winner_overlap_mean_blocks):>7} "
        f"{row.load_avg_1m:>5.2f}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _frac(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def evaluate_goals(rows: list[Row], scenarios: list[Scenario]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    for scenario in scenarios:
        ttft = {r.mode: r.ttft_p50_ms for r in rows if r.scenario == scenario.name}
        kv, rr, rnd = ttft.get("kv"), ttft.get("round-robin"), ttft.get("random")
        vs_rr = rr / kv if kv and rr else None
        goals[scenario.name] = {
            "ttft_p50_vs_round_robin": vs_rr,
            "ttft_p50_vs_random": rnd / kv if kv and rnd else None,
            "goal": scenario.goal_ttft_ratio,
            "met": None if vs_rr is None else vs_rr >= scenario.goal_ttft_ratio,
        }
    return goals


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="mocker,torch", help="mocker,torch")
    parser.add_argument("--quick", action="store_true", help="a quarter of the conversations")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    scenarios = [quick(SCENARIOS[n]) if args.quick else SCENARIOS[n] for n in names]
    load_start = tuple(float(x) for x in Path("/proc/loadavg").read_text().split()[:3])
    code_at_start = code_version(REPO)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dynask-routing-") as tmp:
        for scenario in scenarios:
            rows += run_scenario(scenario, Path(tmp))
    goals = evaluate_goals(rows, scenarios)
    print("\n" + HEADER)
    for row in rows:
        print(format_row(row))
    for name, goal in goals.items():
        print(
            f"{name}: TTFT p50 kv vs round-robin {_num(goal['ttft_p50_vs_round_robin'])}x, "
            f"vs random {_num(goal['ttft_p50_vs_random'])}x (goal >= {goal['goal']}x: "
            f"{goal['met']})"
        )
    write_json(
        args.out,
        {
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "code_at_start": code_at_start,
            "code_at_end": code_version(REPO),
            "machine": machine_facts(load_start),  # type: ignore[arg-type]
            "scenarios": [asdict(s) for s in scenarios],
            "rows": [asdict(r) for r in rows],
            "goals": goals,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
