"""KV transfer between two GPUs of one host: our UCXX transport (GPU memory sent as
device buffers, so UCX can use CUDA IPC over NVLink) against torch's peer copy
(``tensor.to('cuda:1')``), 16–256 MiB, in the same run (part 3 of the disaggregation
benchmark; parts 1 and 2 are ``bench/disaggregation/modes.py``).

The sender is this process on ``cuda:0``; the receiver a child process on ``cuda:1`` that
preallocates the destination, as a decode actor does. One figure is one whole transfer:
from the send to the receiver's report that the tensor is complete (after a device
synchronize). The peer copy is timed in this process between two synchronizes. Goal:
UCXX at least 50% of the peer-copy bandwidth.

Needs two CUDA devices, torch, and the UCXX wheels (``ucxx-cu13``, ``libucxx-cu13``,
``libucx-cu13``, ``librmm-cu13``, ``rmm-cu13``, ``cuda-core``, ``rapids-logger``, and
``msgpack``); ``bench/disaggregation/gpu.sh`` installs carried wheels and runs it:

    bash bench/disaggregation/gpu.sh            # on the 2-GPU machine, from the repository root
    python -m bench.disaggregation.gpu --sizes 16,64,256 --repeats 7

Prints a table and writes JSON to ``bench/results/disagg-gpu.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import torch

from bench.common.report import write_json
from bench.disaggregation.transfer import measure


def main() -> int:
    args = _parser().parse_args()
    if torch.cuda.device_count() < 2:
        print("disagg_gpu.py needs two CUDA devices; found", torch.cuda.device_count())
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = measure(
        ["ucxx"],
        sizes,
        args.repeats,
        devices=("cuda:0", "cuda:1"),
        baseline=("torch peer copy", _peer_copy),
    )
    print("\nGPU to GPU (cuda:0 -> cuda:1), GB/s, median of repeats")
    print(f"{'MiB':>5} {'method':<16} {'GB/s':>8} {'best':>8} {'vs peer copy':>13}")
    for r in rows:
        print(
            f"{r.size_mib:>5} {r.transport:<16} {r.gbps_median:>8.1f} {r.gbps_best:>8.1f} "
            f"{r.ratio_to_baseline:>13.2f}"
        )
    ucxx = [r.ratio_to_baseline for r in rows if r.transport == "ucxx"]
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(2)],
        "peer_access": torch.cuda.can_device_access_peer(0, 1),
        "torch": torch.__version__,
        "rows": [asdict(r) for r in rows],
        "goal_ucxx_at_least_half_of_peer_copy": bool(ucxx) and min(ucxx) >= 0.5,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print(f"\nwrote {out}")
    return 0


def _peer_copy(kv: torch.Tensor) -> None:
    torch.cuda.synchronize(kv.device)
    copied = kv.to("cuda:1")
    torch.cuda.synchronize(copied.device)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,64,256", help="MiB per transfer")
    parser.add_argument("--repeats", type=int, default=7)
    default_out = Path(__file__).resolve().parents[1] / "results" / "disagg-gpu.json"
    parser.add_argument("--out", default=str(default_out))
    return parser


if __name__ == "__main__":
    sys.exit(main())
