"""Benchmark of disaggregated prefill/decode, in one run:

1. KV transfer bandwidth between two processes, our ``tcp`` and ``ucxx`` transports
   against a blocking raw socket (``disagg_transfer.py``), 16–256 MiB of KV blocks.
   Goal: CPU transfer at least 80% of the raw socket.
2. TTFT, ITL and goodput, aggregated against disaggregated at equal actor count, on a
   mixed long/short-prompt workload (``disagg_serving.py``): 4 mocker actors (the
   mocker's GPU-like timing model at real time; the KV wire time simulated from the
   bytes of a Llama-3-8B block and ``--sim-gbps``), 4 aggregated against 2 prefill + 2
   decode; and 2 built-in engines serving the bundled SmolLM2-135M on this CPU, 2
   aggregated against 1 prefill + 1 decode.
   Goal: disaggregated goodput above aggregated on the long-prompt mix.

Part 3 (GPU to GPU through UCXX against torch peer copy) is ``bench/disaggregation/gpu.py``.

    .venv/bin/python -m bench.disaggregation.modes            # everything, ~10 minutes
    .venv/bin/python -m bench.disaggregation.modes --parts transfer --sizes 16,64
    .venv/bin/python -m bench.disaggregation.modes --parts serving --scenarios mocker

Prints tables and writes JSON to ``bench/results/disagg.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common.report import write_json
from bench.disaggregation.serving import ModeRow, Workload, mode_roles, run_mode
from bench.disaggregation.transfer import measure
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.disagg.orchestrator import DisaggOptions

LLAMA_8B_BLOCK_BYTES = 32 * 2 * 8 * 128 * 2 * 16  # layers·(K,V)·kv_heads·head_dim·bf16·tokens

WORKLOADS = {
    "mocker": Workload(
        requests=240,
        rate=10.0,
        long_fraction=0.3,
        long_tokens=4096,
        short_tokens=256,
        max_tokens=128,
        ttft_target_s=1.0,
        itl_target_s=0.030,
        stall_target_s=0.100,
    ),
    "torch": Workload(
        requests=24,
        rate=0.4,
        long_fraction=0.5,
        long_tokens=512,
        short_tokens=32,
        max_tokens=32,
        ttft_target_s=4.0,
        itl_target_s=0.150,
        stall_target_s=0.500,
    ),
}


def main() -> int:
    args = _parser().parse_args()
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
    }
    parts = args.parts.split(",")
    if "transfer" in parts:
        sizes = [int(s) for s in args.sizes.split(",")]
        kinds = ["tcp"] + (["ucxx"] if _has_ucxx() else [])
        rows = measure(kinds, sizes, args.repeats)
        result["transfer"] = [asdict(r) for r in rows]
        _print_transfer(rows)
    if "serving" in parts:
        result["serving"] = []
        for scenario in args.scenarios.split(","):
            mode_rows = asyncio.run(_serving(scenario, args))
            result["serving"] += [asdict(r) for r in mode_rows]
            _print_serving(mode_rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print(f"\nwrote {out}")
    return 0


async def _serving(scenario: str, args: argparse.Namespace) -> list[ModeRow]:
    workload = WORKLOADS[scenario]
    if scenario == "mocker":
        workload = replace(
            workload,
            rate=args.mocker_rate or workload.rate,
            requests=args.mocker_requests or workload.requests,
        )
    if scenario == "mocker":
        ms_per_block = LLAMA_8B_BLOCK_BYTES / (args.sim_gbps * 1e9) * 1000
        engine_args = {"speedup_ratio": 1.0, "kv_transfer_ms_per_block": ms_per_block}
        spec = EngineSpec(kind="mocker", model=None, engine_args=engine_args)
        disagg = DisaggOptions(
            min_remote_prefill_tokens=1024, max_prefills_per_actor=args.max_prefills_per_actor
        )
    else:
        spec = EngineSpec(kind="torch", model=None, engine_args={"kv_cache_gib": 0.25})
        disagg = DisaggOptions(min_remote_prefill_tokens=128)
    actors, prefill = (args.mocker_actors, args.mocker_prefill) if scenario == "mocker" else (2, 1)
    return [
        await run_mode(scenario, mode, mode_roles(mode, actors, prefill), spec, workload, disagg)
        for mode in ("aggregated", "disaggregated")
    ]


def _print_transfer(rows: list[Any]) -> None:
    print("\nKV transfer bandwidth, two processes on this machine (GB/s, median of repeats)")
    print(f"{'MiB':>5} {'transport':<11} {'GB/s':>7} {'best':>7} {'vs raw':>7}")
    for r in rows:
        print(
            f"{r.size_mib:>5} {r.transport:<11} {r.gbps_median:>7.2f} {r.gbps_best:>7.2f} "
            f"{r.ratio_to_baseline:>7.2f}"
        )


def _print_serving(rows: list[ModeRow]) -> None:
    print(
        f"\n{'scenario':<8} {'actors':<22} {'req':>4} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'max gap':>8} {'req/s':>6} {'goodput':>8} "
        f"{'no-stall':>8}  remote/busy"
    )
    for r in rows:
        print(
            f"{r.scenario:<8} {r.roles:<22} {r.requests:>4} {r.ttft_p50_ms:>9.0f} "
            f"{r.ttft_p99_ms:>9.0f} {r.itl_p50_ms:>8.1f} {r.itl_p99_ms:>8.1f} "
            f"{r.max_gap_p50_ms:>8.0f} "
            f"{r.throughput_rps:>6.2f} {r.goodput_rps:>8.2f} {r.goodput_no_stall_rps:>8.2f}  "
            f"{r.disagg_counters.get('remote_prefills', 0)}/"
            f"{r.disagg_counters.get('local_prefill_busy', 0)}"
        )


def _has_ucxx() -> bool:
    try:
        import ucxx  # noqa: F401
    except ImportError:
        print("ucxx is not installed: measuring tcp only", file=sys.stderr)
        return False
    return True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="transfer,serving")
    parser.add_argument("--sizes", default="16,64,256", help="MiB per transfer")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--scenarios", default="mocker,torch")
    parser.add_argument(
        "--sim-gbps", type=float, default=25.0, help="mocker: simulated KV bandwidth, GB/s"
    )
    parser.add_argument("--mocker-actors", type=int, default=4, help="actors per mode")
    parser.add_argument("--mocker-prefill", type=int, default=2, help="of them prefill")
    parser.add_argument(
        "--max-prefills-per-actor",
        type=int,
        default=DisaggOptions().max_prefills_per_actor,
        help="mocker: in flight per prefill actor before decode actors prefill themselves",
    )
    parser.add_argument("--mocker-rate", type=float, default=None, help="arrivals/s")
    parser.add_argument("--mocker-requests", type=int, default=None)
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parents[1] / "results" / "disagg.json")
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
