"""GPU <-> host transfer rate of the KV offload tiers against a plain ``tensor.to()`` copy.

On a CUDA machine (an H200 here): a paged KV cache of Llama-3.1-8B's shape by default (32
layers, 8 KV heads of 128, blocks of 16 tokens, bf16: 2 MiB per block, in per-layer K
and V tensors as the engine holds them) and a pinned host tier. For ``--blocks`` blocks
at once (default 256 = 512 MiB) it times, in the same run:

* **offload** (GPU -> host): the tier path the engine takes when blocks are evicted
  (``HostTier.store`` with ``RunnerBlocks.save_to_host``: one gather on the GPU, one DMA
  copy per block into the pinned buffer), against ``tensor.to("cpu")`` of one contiguous
  GPU tensor of the same size (pageable destination), and against a copy into a pinned
  tensor (the DMA ceiling);
* **onboard** (host -> GPU): ``RunnerBlocks.load_from_host`` (one DMA copy per block into
  a staging tensor, then a scatter into the paged cache), against ``tensor.to("cuda")``
  of a pageable and of a pinned host tensor.

Blocks are scattered over the cache (random ids), as after a while of serving. Each
figure is the best of ``--repeats`` timed runs after a warm-up, synchronized with the
device. Prints a table and writes ``bench/results/offload-gpu.json``::

    python -m bench.offload.gpu
    python -m bench.offload.gpu --blocks 1024 --layers 80 --kv-heads 8   # a 70B shape

Only torch and this repository are needed. ``--device cpu`` runs the same code on a CPU
(no pinning; a smoke test of the script, not a measurement of anything GPU).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.common.report import write_json
from dynask.actors.engine.kv_cache.tiers import RunnerBlocks
from dynask.kv.block_pool import CachedBlock
from dynask.kv.hashing import SequenceHash
from dynask.kv.host_tier import HostTier

GIB = 2**30


def timed(device: torch.device, fn: Callable[[], Any], repeats: int) -> float:
    """Best wall seconds of ``fn`` with the device synchronized around it."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cache-blocks", type=int, default=4096, help="device cache size")
    parser.add_argument("--blocks", type=int, default=256, help="blocks moved per copy")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="bench/results/offload-gpu.json")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cuda = device.type == "cuda"
    block_shape = (args.block_size, args.kv_heads, args.head_dim)
    caches = [
        (
            torch.randn((args.cache_blocks, *block_shape), device=device).to(dtype),
            torch.randn((args.cache_blocks, *block_shape), device=device).to(dtype),
        )
        for _ in range(args.layers)
    ]
    blocks = RunnerBlocks(caches)
    tier_shape = (args.layers, 2, *block_shape)
    host = HostTier(
        args.blocks, tier_shape, dtype, pin_memory=cuda, copy_device=device if cuda else None
    )
    generator = torch.Generator().manual_seed(0)
    ids = torch.randperm(args.cache_blocks, generator=generator)[: args.blocks].tolist()
    cached = [CachedBlock(SequenceHash(i), None, (0,) * args.block_size) for i in ids]
    nbytes = args.blocks * host.block_nbytes

    def tier_offload() -> None:
        for block in cached:  # a fresh store each time: every block is copied
            host.drop(block.block_hash)

        def copy_in(rows: list[int], slots: list[int]) -> None:
            blocks.save_to_host([ids[r] for r in rows], host.buffer, slots)

        host.store(cached, copy_in)

    slots = list(range(args.blocks))

    def tier_onboard() -> None:
        blocks.load_from_host(ids, host.buffer, slots)

    flat_gpu = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=device)
    flat_host = torch.empty(nbytes // dtype.itemsize, dtype=dtype)
    flat_pinned = torch.empty(nbytes // dtype.itemsize, dtype=dtype, pin_memory=cuda)
    rows: list[dict[str, Any]] = []
    cases: list[tuple[str, str, Callable[[], Any]]] = [
        ("offload GPU->host", "tier: gather + DMA per block (pinned)", tier_offload),
        ("offload GPU->host", "tensor.to('cpu') (pageable)", lambda: flat_gpu.to("cpu")),
        ("offload GPU->host", "copy_ into pinned", lambda: flat_pinned.copy_(flat_gpu)),
        ("onboard host->GPU", "tier: DMA per block + scatter", tier_onboard),
        ("onboard host->GPU", "tensor.to(device) (pageable)", lambda: flat_host.to(device)),
        ("onboard host->GPU", "tensor.to(device) (pinned)", lambda: flat_pinned.to(device)),
    ]
    for direction, method, fn in cases:
        seconds = timed(device, fn, args.repeats)
        rows.append(
            {
                "direction": direction,
                "method": method,
                "ms": 1000 * seconds,
                "gib_per_s": nbytes / GIB / seconds,
            }
        )
    for direction in ("offload GPU->host", "onboard host->GPU"):
        group = [r for r in rows if r["direction"] == direction]
        plain = next(r for r in group if "pageable" in r["method"])
        for row in group:
            row["vs_plain_to"] = row["gib_per_s"] / plain["gib_per_s"]

    print(
        f"{args.blocks} blocks of {host.block_nbytes / 2**20:.2f} MiB "
        f"({nbytes / GIB:.2f} GiB) on {torch.cuda.get_device_name(device) if cuda else 'cpu'}"
    )
    print(f"{'direction':<18} {'method':<40} {'ms':>8} {'GiB/s':>8} {'vs .to()':>9}")
    for row in rows:
        print(
            f"{row['direction']:<18} {row['method']:<40} {row['ms']:>8.2f} "
            f"{row['gib_per_s']:>8.2f} {row['vs_plain_to']:>8.2f}x"
        )
    report = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch_version": torch.__version__,
            "platform": platform.platform(),
        },
        "config": vars(args),
        "block_bytes": host.block_nbytes,
        "bytes_per_copy": nbytes,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
