"""What OpenTelemetry tracing costs: the same streaming load with tracing off and on.

Each round starts a fresh cluster twice (``dask scheduler``, one ``dask worker``,
``dynask serve``, separate processes; ``out=mocker`` with no simulated model time, so
the control plane's own cost shows): once plain, once with ``--otel-endpoint`` pointing
at a collector in this process (``bench.common.otlp_receiver``: the real OTLP/HTTP
exporter, a real socket; every request is traced, and each sends a ``traceparent``).
Rounds alternate off/on so drift on a shared machine hits both. Per mode: requests/s,
TTFT p50/p99, end-to-end p50, CPU ms per request of the control plane and of the engine's
worker, and the spans the collector received. The ratios on/off are the result.

    .venv/bin/python -m bench.serving.tracing                  # 2 rounds, 16 streams
    .venv/bin/python -m bench.serving.tracing --rounds 4       # steadier medians
    .venv/bin/python -m bench.serving.tracing --quick          # a smoke run

Writes ``bench/results/tracing.json`` (``--out``) and a PNG beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common.load import LoadSpec, build_prompts, new_client, run_load, summarize
from bench.common.otlp_receiver import OtlpReceiver
from bench.common.processes import dynask_stack
from bench.common.report import code_version, machine_facts, write_json
from bench.serving.serve import CpuSample, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
DEFAULT_OUT = REPO / "bench" / "results" / "tracing.json"
MOCKER_ARGS = {"speedup_ratio": 0}
MODES = ("off", "on")
TRACEPARENT = "00-{:032x}-00f067aa0ba902b7-01"
METRICS = (
    ("req_per_s", "req/s"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p50_ms", "e2e p50 ms"),
    ("cp_cpu_ms_per_req", "CP CPU ms/req"),
    ("engine_cpu_ms_per_req", "engine CPU ms/req"),
)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _measure(
    base_url: str, model: str, spec: LoadSpec, warm: list[str], measured: list[str], target: Any
) -> dict[str, Any]:
    async with new_client(spec, base_url) as client:
        client.headers["traceparent"] = TRACEPARENT.format(1)  # ignored while tracing is off
        await run_load(client, spec, model, warm)
        before = CpuSample.take(target)
        wall_s, records = await run_load(client, spec, model, measured)
        after = CpuSample.take(target)
    load = summarize(wall_s, records, spec.max_tokens)
    ok = max(load.requests_ok, 1)
    return {
        **{k: getattr(load, k) for k in ("req_per_s", "ttft_p50_ms", "ttft_p99_ms")},
        **{k: getattr(load, k) for k in ("e2e_p50_ms", "itl_p50_ms", "requests_ok")},
        "requests_failed": load.requests_failed,
        "cp_cpu_ms_per_req": (after.frontend_s - before.frontend_s) * 1000 / ok,
        "engine_cpu_ms_per_req": (after.engine_s - before.engine_s) * 1000 / ok,
        "load_avg_1m": os.getloadavg()[0],
    }


def run_mode(
    mode: str, args: argparse.Namespace, prompts: list[str], workdir: Path
) -> dict[str, Any]:
    collector = OtlpReceiver() if mode == "on" else None
    serve_args = [] if collector is None else ["--otel-endpoint", collector.url]
    spec = LoadSpec(args.concurrency, args.max_tokens, 120.0)
    warm, measured = prompts[: args.warmup], prompts[args.warmup :]
    try:
        with dynask_stack(
            VENV_BIN, "mocker", MOCKER_ARGS, workdir, args.ready_timeout, serve_args
        ) as target:
            row = asyncio.run(_measure(target.base_url, target.model, spec, warm, measured, target))
            time.sleep(1.5)  # the exporters' batches (1 s delay) reach the collector
    finally:
        if collector is not None:
            collector.close()
    row["mode"] = mode
    row["spans_received"] = 0 if collector is None else len(collector.spans)
    return row


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median over rounds of each metric, on / off."""
    ratios: dict[str, float | None] = {}
    for key, _ in METRICS:
        values = {
            mode: [r[key] for r in rows if r["mode"] == mode and r[key] is not None]
            for mode in MODES
        }
        off, on = (statistics.median(values[m]) if values[m] else None for m in MODES)
        ratios[key] = on / off if off and on is not None else None
    return ratios


def _table(rows: list[dict[str, Any]], ratios: dict[str, float | None]) -> str:
    head = "| round | mode | " + " | ".join(label for _, label in METRICS) + " | spans |"
    lines = [head, "|" + "---|" * (len(METRICS) + 3)]
    for row in rows:
        cells = [_num(row[key]) for key, _ in METRICS]
        lines.append(
            f"| {row['round']} | {row['mode']} | "
            + " | ".join(cells)
            + f" | {row['spans_received']} |"
        )
    cells = [_num(ratios[key], 3) for key, _ in METRICS]
    lines.append("| | **on/off** | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400, help="measured, per mode and round")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="1 round, 60 requests")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.warmup = 1, 60, 10
    load_start = os.getloadavg()
    tokenizer = load_tokenizer()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        for round_index in range(args.rounds):
            for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
                tag = f"r{round_index}-{mode}"
                prompts = build_prompts(
                    tokenizer, args.warmup + args.requests, args.prompt_tokens, tag
                )
                _say(f"round {round_index}, tracing {mode} ...")
                row = run_mode(mode, args, prompts, Path(tmp) / tag)
                rows.append({"round": round_index, **row})
                cpu = row["cp_cpu_ms_per_req"]
                _say(f"  {row['req_per_s']:.1f} req/s, control plane {cpu:.2f} CPU ms/req")
    ratios = _ratios(rows)
    print(_table(rows, ratios))
    document = {
        "benchmark": "tracing_overhead",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
        "tracing_rows": rows,
        "ratios_on_over_off": ratios,
        "code": code_version(REPO),
        "machine": machine_facts(load_start),
    }
    write_json(args.out, document)  # and the PNG beside it
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
