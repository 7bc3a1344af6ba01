"""Where the fused block copy's launch spends its host time, on a GPU (issue 20).

In one process, with the layout reused as the transport reuses it: the time until
``launch_blocks`` returns and until the copy is done, for 1 and 512 blocks of
Llama-3.1-8B's cache shape, by two paths in the same run — the kernel that computes
each row's offsets from the block ids (``launch_blocks`` now) against the rows built on
the device by torch ops and the row kernel (``BlockLayout.rows(..., device)``, before) —
then ``cProfile``'s top entries of 200 one-block ``launch_blocks`` calls.

    python3 -m bench.disaggregation.ipc_launch_profile [--out PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.disaggregation.ipc_gpu import cache
from dynask.kv.gpu import block_copy
from dynask.kv.gpu.block_copy import BlockLayout, launch_blocks

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "disagg-ipc-launch-h200.json"


def rows_on_device(source, src, local, dst, layout) -> block_copy.BlockCopy:
    """The path before: rows built by torch ops on the copy stream, then the row kernel."""
    device = layout.fused_on
    with torch.cuda.device(device), torch.cuda.stream(block_copy._copy_stream(device)):
        table = layout.rows(src, dst, device)
        done = block_copy._launch_on_current_stream(table, source[0], local[0])
    return block_copy.BlockCopy(layout, done)


def timings(launch: Any, repeats: int) -> tuple[float, float]:
    queued, finished = [], []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        started = launch()
        queued.append(time.perf_counter() - start)
        started.wait()
        finished.append(time.perf_counter() - start)
    return statistics.median(queued[1:]), statistics.median(finished[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    source, local = cache(2048), cache(2048)
    layout = BlockLayout.of(source, local)
    assert layout is not None and layout.fused_on is not None
    rows: list[dict[str, Any]] = []
    print(f"{'path':<44} {'blocks':>6} {'queued ms':>10} {'done ms':>9}")
    for blocks in (1, 512):
        src, dst = list(range(blocks)), list(range(1000, 1000 + blocks))
        paths = (("ids kernel (launch_blocks)", launch_blocks),
                 ("rows built on the device + row kernel", rows_on_device))  # fmt: skip
        for name, path in paths:
            queued, done = timings(
                lambda p=path, s=src, d=dst: p(source, s, local, d, layout), args.repeats
            )
            rows.append({"path": name, "blocks": blocks, "queued_s": queued, "done_s": done})
            print(f"{name:<44} {blocks:>6} {queued * 1e3:>10.3f} {done * 1e3:>9.3f}")
        for mine, theirs in zip(local, source, strict=True):  # the last copy, checked
            assert torch.equal(mine[dst], theirs[src])
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(200):
        launch_blocks(source, [7], local, [9], layout).wait()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    profile = "\n".join(line for line in text.getvalue().splitlines() if line.strip())
    print(profile)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    args.out.write_text(
        json.dumps(
            {"gpu": device, "torch": torch.__version__, "rows": rows, "profile": profile}, indent=1
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
