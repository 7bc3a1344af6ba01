"""CPU per request of dynask's control plane on the Mooncake replay, this tree against a base.

Issue 21: on the trace replay dynask's stack spent ~70 ms of CPU per request against
Dynamo's ~19 ms, and on a 2-core machine a stack that needs more CPU than it gets falls
behind its model time and queues. This measures where dynask's goes, per process: the
``bench.routing.server`` process (the control plane: HTTP, routing, the prefix index,
SSE; Dask's scheduler lives there too) and its Dask workers (the mocker actors). Each
phase starts a fresh server from one tree, ``--base`` (e.g. ``git worktree add`` or
``git archive`` of main) or this one, in turn, ``--rounds`` times, on the same slice with
fresh prompt tokens each time (``PromptBuilder(salt)``); the machine is shared, so the
figures that count are the ratios of this tree's to the base's, round by round.

    .venv/bin/python -m bench.routing.control_plane_cpu --base /tmp/main-tree \\
        --slice 3000:3150 --speedup 3 --actors 4 --rounds 2

Prints a table; writes JSON to ``bench/results/control_plane_cpu.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common.processes import (
    cpu_seconds,
    free_port,
    group_cpu_seconds,
    spawned,
    wait_until_ready,
)
from bench.common.report import code_version, machine_facts, write_json
from bench.common.trees import dynask_namespace
from bench.routing.trace import PromptBuilder, load_trace, parse_slice
from bench.routing.trace_client import replay, summarize
from bench.routing.trace_replay import TRACE, warm_up
from bench.routing.trace_systems import PYTHON, READY_TIMEOUT_S, matched_timing

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
MODEL = "bench"  # bench.routing.server.MODEL


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the tree to compare with")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--slice", default="3000:3150")
    parser.add_argument("--speedup", type=float, default=3.0)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "control_plane_cpu.json")
    return parser.parse_args(argv)


def run_phase(
    tree: Path, args: argparse.Namespace, requests: list[Any], salt: int, workdir: Path
) -> dict[str, Any]:
    port = free_port()
    engine_args = json.dumps(matched_timing(args.block_size))
    script = (
        f'cd "{tree}" && exec "{PYTHON}" -m bench.routing.server --engine mocker '
        f"--engine-args '{engine_args}' --actors {args.actors} --workers {args.workers} "
        f"--port {port}"
    )
    env = {**os.environ, "PYTHONPATH": f"{dynask_namespace(tree, workdir)}:{tree}"}
    with spawned(f"server-{salt}", ["bash", "-c", script], workdir, env) as server:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(f"{url}/health", '"ready"', READY_TIMEOUT_S, [server])
        asyncio.run(warm_up([url], MODEL, {"router_mode": "kv"}, args.actors))
        plane_before, group_before = cpu_seconds(server.pid), group_cpu_seconds(server.pid)
        wall, results = asyncio.run(
            replay(
                url,
                MODEL,
                requests,
                speedup=args.speedup,
                builder=PromptBuilder(salt),
                extra_body={"router_mode": "kv"},
            )
        )
        plane = cpu_seconds(server.pid) - plane_before
        group = group_cpu_seconds(server.pid) - group_before
    row = summarize(wall, results)
    row.pop("per_request")
    count = len(requests)
    row["control_plane_cpu_ms_per_request"] = plane / count * 1000
    row["workers_cpu_ms_per_request"] = (group - plane) / count * 1000
    row["stack_cpu_ms_per_request"] = group / count * 1000
    return row


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    requests = load_trace(args.trace)[parse_slice(args.slice)]
    load_start = os.getloadavg()
    trees = {"base": args.base.resolve(), "this": REPO}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cp-cpu-") as tmp:
        for round_number in range(args.rounds):
            for name, tree in trees.items():
                salt = 100 + 2 * round_number + (name == "this")
                row = run_phase(tree, args, requests, salt, Path(tmp))
                rows.append({"tree": name, "round": round_number, **row})
                print(format_row(rows[-1]), file=sys.stderr)
    ratios = round_ratios(rows)
    print(table(rows, ratios))
    write_json(
        args.out,
        {
            "benchmark": "control_plane_cpu",
            "args": {k: str(v) for k, v in vars(args).items()},
            "code": code_version(REPO),
            "machine": machine_facts(load_start),
            "rows": rows,
            "ratios_this_over_base": ratios,
        },
        picture=False,
    )
    print(f"wrote {args.out}", file=sys.stderr)


KEYS = (
    "control_plane_cpu_ms_per_request",
    "workers_cpu_ms_per_request",
    "stack_cpu_ms_per_request",
)


def round_ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """This tree's figure over the base's, per round, and the median over rounds."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["tree"]] = row
    ratios: dict[str, list[float]] = {}
    for pair in by_round.values():
        base, this = pair["base"], pair["this"]
        values = {key: (this[key], base[key]) for key in KEYS}
        values["ttft_mean"] = (this["ttft_ms"]["mean"], base["ttft_ms"]["mean"])
        values["ttft_p99"] = (this["ttft_ms"]["p99"], base["ttft_ms"]["p99"])
        for key, (new, old) in values.items():
            ratios.setdefault(key, []).append(new / old)
    return {key: {"rounds": v, "median": statistics.median(v)} for key, v in ratios.items()}


def format_row(row: dict[str, Any]) -> str:
    ttft = row["ttft_ms"]
    return (
        f"{row['tree']:5} r{row['round']}  ok {row['requests_ok']:4}  "
        f"CP {row['control_plane_cpu_ms_per_request']:6.1f}  "
        f"workers {row['workers_cpu_ms_per_request']:6.1f}  "
        f"stack {row['stack_cpu_ms_per_request']:6.1f} ms/req  "
        f"TTFT mean {ttft['mean']:7.0f}  p99 {ttft['p99']:7.0f} ms  hit {row['kv_hit_rate']:.3f}"
    )


def table(rows: list[dict[str, Any]], ratios: dict[str, Any]) -> str:
    lines = [format_row(row) for row in rows]
    lines.append(
        "this / base (median over rounds): "
        + ", ".join(f"{key} {value['median']:.2f}" for key, value in ratios.items())
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
