"""Benchmark of disaggregated prefill/decode, in one run:

1. KV transfer bandwidth between two processes, our ``tcp`` and ``ucxx`` transports
   against a blocking raw socket (``disagg_transfer.py``), 16–256 MiB of KV blocks.
   Goal: CPU transfer at least 80% of the raw socket.
2. TTFT, ITL and goodput, aggregated (2 aggregated actors) against disaggregated
   (1 prefill + 1 decode actor) at equal actor count, on a mixed long/short-prompt
   workload (``disagg_serving.py``), with mocker actors (the mocker's GPU-like timing
   model at real time; the KV wire time simulated from bytes per block and a bandwidth)
   and with built-in engines serving the bundled SmolLM2-135M on this CPU.
   Goal: disaggregated goodput above aggregated on the long-prompt mix.

Part 3 (GPU to GPU through UCXX against torch peer copy) is ``bench/disagg_gpu.py``.

    .venv/bin/python bench/disagg.py                          # everything, ~10 minutes
    .venv/bin/python bench/disagg.py --parts transfer --sizes 16,64
    .venv/bin/python bench/disagg.py --parts serving --scenarios mocker

Prints tables and writes JSON to ``bench/results/disagg.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from disagg_serving import ModeRow, Workload, run_mode
from disagg_transfer import measure

from dynask.actors.engine_factory import EngineSpec
from dynask.control_plane.disagg_orchestrator import DisaggOptions

LLAMA_8B_BLOCK_BYTES = 32 * 2 * 8 * 128 * 2 * 16  # layers·(K,V)·kv_heads·head_dim·bf16·tokens

WORKLOADS = {
    "mocker": Workload(
        requests=160,
        rate=6.0,
        long_fraction=0.3,
        long_tokens=4096,
        short_tokens=256,
        max_tokens=128,
        ttft_target_s=1.0,
        itl_target_s=0.030,
    ),
    "torch": Workload(
        requests=16,
        rate=0.4,
        long_fraction=0.4,
        long_tokens=512,
        short_tokens=32,
        max_tokens=32,
        ttft_target_s=4.0,
        itl_target_s=0.150,
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
            rows = asyncio.run(_serving(scenario, args))
            result["serving"] += [asdict(r) for r in rows]
            _print_serving(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


async def _serving(scenario: str, args: argparse.Namespace) -> list[ModeRow]:
    workload = WORKLOADS[scenario]
    if scenario == "mocker":
        ms_per_block = LLAMA_8B_BLOCK_BYTES / (args.sim_gbps * 1e9) * 1000
        engine_args = {"speedup_ratio": 1.0, "kv_transfer_ms_per_block": ms_per_block}
        spec = EngineSpec(kind="mocker", model=None, engine_args=engine_args)
        disagg = DisaggOptions(min_remote_prefill_tokens=1024)
    else:
        spec = EngineSpec(kind="torch", model=None, engine_args={"kv_cache_gib": 0.25})
        disagg = DisaggOptions(min_remote_prefill_tokens=128)
    return [
        await run_mode(scenario, mode, spec, workload, disagg)
        for mode in ("aggregated", "disaggregated")
    ]


def _print_transfer(rows: list[Any]) -> None:
    print("\nKV transfer bandwidth, two processes on this machine (GB/s, median of repeats)")
    print(f"{'MiB':>5} {'transport':<11} {'GB/s':>7} {'best':>7} {'vs raw':>7}")
    raw = {r.size_mib: r.gbps_median for r in rows if r.transport == "raw socket"}
    for r in rows:
        ratio = r.gbps_median / raw[r.size_mib]
        print(
            f"{r.size_mib:>5} {r.transport:<11} {r.gbps_median:>7.2f} {r.gbps_best:>7.2f} "
            f"{ratio:>7.2f}"
        )


def _print_serving(rows: list[ModeRow]) -> None:
    print(
        f"\n{'scenario':<8} {'mode':<14} {'req':>4} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'max gap':>8} {'req/s':>6} {'goodput':>8}  remote"
    )
    for r in rows:
        print(
            f"{r.scenario:<8} {r.mode:<14} {r.requests:>4} {r.ttft_p50_ms:>9.0f} "
            f"{r.ttft_p99_ms:>9.0f} {r.itl_p50_ms:>8.1f} {r.itl_p99_ms:>8.1f} "
            f"{r.max_gap_p50_ms:>8.0f} "
            f"{r.throughput_rps:>6.2f} {r.goodput_rps:>8.2f}  "
            f"{r.disagg_counters.get('remote_prefills', 0)}"
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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scenarios", default="mocker,torch")
    parser.add_argument(
        "--sim-gbps", type=float, default=25.0, help="mocker: simulated KV bandwidth, GB/s"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "disagg.json"))
    return parser


if __name__ == "__main__":
    sys.exit(main())
