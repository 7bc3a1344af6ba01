"""CPU per request of dynask's serving processes on a trace slice, this tree against a base.

The issue-21 replay (``trace_replay``) loses to Dynamo on CPU: on a 2-core machine our
Python processes fall behind their model time. This benchmark measures where the CPU goes,
split by process: the control plane (``bench.routing.server``'s own process) and the Dask
worker processes that host the mocker actors. Each round starts one fresh server from the
base tree (``--base``, default ``main``: ``git archive`` into a temporary folder) and one
from this tree, in alternating order, and replays the same slice at the trace's times
(``--speedup``) with the mocker timing of ``trace_replay`` (``matched_timing``); CPU
seconds are read from ``/proc`` before and after the replay (the warm-up left out).
Ratios are new over base within a round, since the machine is shared and noisy.

``--profile`` samples the worker processes of this tree's phases with py-spy (``--gil``:
only the thread holding the GIL, i.e. Python CPU) and reports the functions where the
samples fell (self and inclusive shares of the dynask frames).

    .venv/bin/python -m bench.routing.actor_cpu --slice 3000:3150 --speedup 3 --rounds 2

Prints a table; writes JSON to ``bench/results/actor_cpu.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from bench.common.processes import child_pids, cpu_seconds, free_port, spawned, wait_until_ready
from bench.common.report import code_version, machine_facts, write_json
from bench.common.trees import archive_tree, dynask_namespace
from bench.routing.trace import PromptBuilder, load_trace, parse_slice
from bench.routing.trace_client import replay, summarize
from bench.routing.trace_replay import TRACE, warm_up
from bench.routing.trace_systems import matched_timing

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
PY_SPY = REPO / ".venv" / "bin" / "py-spy"
MODEL = "bench"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--slice", default="3000:3150")
    parser.add_argument("--speedup", type=float, default=3.0)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--mode", default="kv", help="router_mode of every request")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", default="main", help="git ref of the base tree")
    parser.add_argument("--profile", action="store_true", help="py-spy the new tree's workers")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "actor_cpu.json")
    return parser.parse_args(argv)


@contextmanager
def server(tree: Path, namespace: Path, args: argparse.Namespace, workdir: Path, name: str):
    """A ``bench.routing.server`` of ``tree`` (the dynask namespace from ``namespace``, so
    the base tree's code is the one imported): its URL and its process id."""
    port = free_port()
    argv = [
        str(PYTHON),
        *("-m", "bench.routing.server", "--engine", "mocker"),
        *("--engine-args", json.dumps(matched_timing(args.block_size))),
        *("--actors", str(args.actors), "--workers", str(args.workers), "--port", str(port)),
    ]
    env = {**os.environ, "PYTHONPATH": f"{namespace}:{tree}"}
    with spawned(name, argv, workdir, env) as process:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(f"{url}/health", '"ready"', 600.0, [process])
        yield url, process.pid


def workers_of(pid: int) -> list[int]:
    return [p for p in child_pids(pid) if "dask worker" in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def phase(url: str, pid: int, args: argparse.Namespace, profile_to: Path | None) -> dict[str, Any]:
    """Warm-up, then the slice, with each process's CPU seconds over the slice."""
    requests = load_trace(args.trace)[parse_slice(args.slice)]
    extra = {"router_mode": args.mode}
    asyncio.run(warm_up([url], MODEL, extra, args.actors))
    workers = workers_of(pid)
    before = {p: cpu_seconds(p) for p in [pid, *workers]}
    spies = [_spy(p, profile_to) for p in workers] if profile_to is not None else []
    builder = PromptBuilder(1)
    wall, results = asyncio.run(
        replay(url, MODEL, requests, speedup=args.speedup, builder=builder, extra_body=extra)
    )
    after = {p: cpu_seconds(p) for p in before}
    for spy in spies:  # py-spy writes its samples when interrupted
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    row = summarize(wall, results)
    row.pop("per_request")
    count = len(requests)
    row["control_plane_cpu_ms_per_request"] = (after[pid] - before[pid]) * 1000 / count
    row["workers_cpu_ms_per_request"] = sum(after[p] - before[p] for p in workers) * 1000 / count
    return row


def _spy(pid: int, folder: Path) -> subprocess.Popen[bytes]:
    if not PY_SPY.exists():
        raise SystemExit(f"--profile needs py-spy: {REPO / '.venv/bin/pip'} install py-spy")
    output = folder / f"worker-{pid}.txt"
    argv = [str(PY_SPY), "record", "--pid", str(pid), "--gil", "--rate", "200"]
    argv += ["--format", "raw", "--nonblocking", "-o", str(output)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_summary(folder: Path, top: int = 45) -> dict[str, Any]:
    """Self and inclusive shares of the sampled functions over every worker's samples, and
    the share of each of the worker's periodic callbacks (Dask's own timers)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    periodic: collections.Counter[str] = collections.Counter()
    total = 0
    for path in folder.glob("worker-*.txt"):
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            frames = [_frame(f) for f in stack.split(";")]
            total += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
            for position, frame in enumerate(frames[:-1]):
                if frame.startswith("PeriodicCallback._run "):
                    periodic[frames[position + 1]] += count
                    break
    share: dict[str, Any] = {"samples": total}
    for name, counter in (("self", own), ("inclusive", inclusive), ("periodic", periodic)):
        share[name] = {f: round(n / total, 4) for f, n in counter.most_common(top)} if total else {}
    return share


def _frame(text: str) -> str:
    match = re.match(r"(.*) \((.*?):\d+\)$", text)
    if match is None:
        return text
    path = match.group(2)
    for marker in ("site-packages/", "/tree/", str(REPO) + "/", "python3.12/"):
        path = path.split(marker)[-1]
    return f"{match.group(1)} ({path})"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    load_start = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="actor-cpu-") as tmp:
        work = Path(tmp)
        base = archive_tree(args.base, work / "base")
        trees = {
            "base": (base, dynask_namespace(base, work)),
            "new": (REPO, dynask_namespace(REPO, work)),
        }
        profile = work / "profile" if args.profile else None
        if profile is not None:
            profile.mkdir()
        for number in range(args.rounds):
            order = ["base", "new"] if number % 2 == 0 else ["new", "base"]
            for label in order:
                tree, namespace = trees[label]
                with server(tree, namespace, args, work, f"{label}-{number}") as (url, pid):
                    spy = profile if label == "new" else None
                    row = {"round": number, "tree": label, **phase(url, pid, args, spy)}
                rows.append(row)
                print(format_row(row), file=sys.stderr)
        profiled = profile_summary(profile) if profile is not None else None
    print(HEADER)
    for row in rows:
        print(format_row(row))
    ratio = ratios(rows)
    print(f"new / base, median over rounds: {json.dumps(ratio)}")
    document = {
        "benchmark": "bench.routing.actor_cpu",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "slice": args.slice,
        "speedup": args.speedup,
        "actors": args.actors,
        "workers": args.workers,
        "base": args.base,
        "matched_timing": matched_timing(args.block_size),
        "rows": rows,
        "new_over_base": ratio,
        "worker_profile": profiled,
        "code": code_version(REPO),
        "machine": machine_facts(load_start),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


HEADER = (
    f"{'round':>5} {'tree':<5} {'ok':>4} {'TTFT avg':>9} {'p99':>8} {'hit':>6} "
    f"{'CP ms/req':>10} {'workers ms/req':>15}"
)
STATS = {
    "ttft_mean": lambda r: r["ttft_ms"]["mean"],
    "ttft_p99": lambda r: r["ttft_ms"]["p99"],
    "control_plane_cpu": lambda r: r["control_plane_cpu_ms_per_request"],
    "workers_cpu": lambda r: r["workers_cpu_ms_per_request"],
}


def format_row(row: dict[str, Any]) -> str:
    hit = row["kv_hit_rate"]
    return (
        f"{row['round']:>5} {row['tree']:<5} {row['requests_ok']:>4} "
        f"{row['ttft_ms']['mean'] or 0:>9.0f} {row['ttft_ms']['p99'] or 0:>8.0f} "
        f"{'-' if hit is None else f'{hit:.3f}':>6} "
        f"{row['control_plane_cpu_ms_per_request']:>10.1f} "
        f"{row['workers_cpu_ms_per_request']:>15.1f}"
    )


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median over rounds of new / base, per statistic."""
    out: dict[str, float | None] = {}
    for stat, read in STATS.items():
        per_round = []
        for number in sorted({r["round"] for r in rows}):
            pair = {r["tree"]: read(r) for r in rows if r["round"] == number}
            if pair.get("base") and pair.get("new") is not None:
                per_round.append(pair["new"] / pair["base"])
        out[stat] = round(median(per_round), 3) if per_round else None
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
