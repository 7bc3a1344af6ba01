"""Where a cuda_ipc transfer's time goes, phase by phase, and how it waits for its copy.

``bench.disaggregation.ipc_gpu`` gives a transfer's whole time (1 GiB over CUDA IPC:
1.255 ms on the H200 against 0.82 ms for the same fused copy in one process and 0.53 ms
for ``copy_()``); this probe splits it. A receiver process (``--serve``) shares a paged
cache of Llama-3.1-8B's shape (as ``ipc_gpu``); this process sends 1 block and 512
consecutive blocks with ``IPCTransport.send_blocks``, stamping each phase by wrapping the
transport's own steps: the ``begin`` round trip, the copy's launch (``launch_blocks``
returns), the wait for its event, the ``done`` frame, and what is left. The copy's own
GPU time comes from CUDA events around the same launch in this process. Each wait
strategy (``kv.transport.cuda_ipc.wait_for_copy``) runs in turn:

- ``thread``: the event's wait in ``asyncio.to_thread`` (the transport's default);
- ``poll``: ``event.query()`` on the loop between ``asyncio.sleep(0)`` yields;
- ``block``: the event's wait on the loop itself (the floor: no hop, loop blocked).

Medians of ``--repeats`` after a warm-up.

    python -m bench.disaggregation.ipc_timeline         # on the H200 (gpu_serving.sh ipc)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

from bench.disaggregation.ipc_gpu import cache, write_gpu_result
from dynask.kv.gpu.block_copy import BlockCopy, BlockLayout, launch_blocks
from dynask.kv.transfer import TransferId
from dynask.kv.transport import control as block_transport
from dynask.kv.transport import cuda_ipc as transfer_ipc
from dynask.kv.transport.cuda_ipc import IPCTransport

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "disagg-ipc-timeline-h200.json"
SIZES = {"one": 1, "512": 512}


async def _thread(started: BlockCopy) -> None:
    await asyncio.to_thread(started.wait)


async def _poll(started: BlockCopy) -> None:
    if started.done is not None:
        while not started.done.query():  # type: ignore[no-untyped-call]
            await asyncio.sleep(0)


async def _block(started: BlockCopy) -> None:
    started.wait()


WAITS: dict[str, Callable[[BlockCopy], Awaitable[None]]] = {
    "thread": _thread,
    "poll": _poll,
    "block": _block,
}


def transfer_ids(repeats: int) -> dict[str, list[int]]:
    return {
        f"{wait}-{size}-{r}": list(range(1000, 1000 + n))
        for wait in WAITS
        for size, n in SIZES.items()
        for r in range(repeats + 1)
    }


async def serve(args: argparse.Namespace) -> None:
    receiver = IPCTransport()
    receiver.share(cache(args.cache_blocks))
    address = await receiver.listen("127.0.0.1")
    futures = [
        receiver.expect_blocks(TransferId(tid), dst)
        for tid, dst in transfer_ids(args.repeats).items()
    ]
    print(address, flush=True)
    await asyncio.wait_for(asyncio.gather(*futures), 300)
    await asyncio.sleep(0.5)
    await receiver.close()


class Stamps:
    """Wraps the transport's steps to note when each returned."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []
        original_ask, original_write = block_transport._ask, block_transport._write
        original_launch = launch_blocks  # what kv.transport.cuda_ipc launches with

        async def ask(peer: Any, message: list[Any]) -> list[Any]:
            reply = await original_ask(peer, message)
            self.marks.append(("answered", time.perf_counter()))
            return reply

        def launch(*a: Any, **k: Any) -> BlockCopy:
            started = original_launch(*a, **k)
            self.marks.append(("launched", time.perf_counter()))
            return started

        async def write(writer: Any, message: list[Any]) -> None:
            if message[0] == "done":
                self.marks.append(("waited", time.perf_counter()))
            await original_write(writer, message)
            if message[0] == "done":
                self.marks.append(("done sent", time.perf_counter()))

        block_transport._ask, block_transport._write = ask, write  # type: ignore[assignment]
        setattr(transfer_ipc, "launch_blocks", launch)  # noqa: B010 (mypy: not re-exported)


def phases(start: float, end: float, marks: list[tuple[str, float]]) -> dict[str, float]:
    at = dict(marks)
    return {
        "begin round trip": at["answered"] - start,
        "launch": at["launched"] - at["answered"],
        "wait": at["waited"] - at["launched"],
        "done frame": at["done sent"] - at["waited"],
        "rest": end - at["done sent"],
        "total": end - start,
    }


def gpu_copy_ms(source: list[torch.Tensor], blocks: int, repeats: int) -> float:
    """The fused copy's GPU time in this process (CUDA events around the launch)."""
    local = cache(len(source[0]))
    layout = BlockLayout.of(source, local)
    ids = list(range(blocks))
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream = transfer_ipc_copy_stream(source[0].device)
        begin.record(stream)
        started = launch_blocks(source, ids, local, ids, layout)
        end.record(stream)
        started.wait()
        end.synchronize()
        times.append(float(begin.elapsed_time(end)))
    return statistics.median(times[1:])


def transfer_ipc_copy_stream(device: torch.device) -> torch.cuda.Stream:
    from dynask.kv.gpu.block_copy import _copy_stream

    return _copy_stream(device)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.disaggregation.ipc_timeline", "--serve",
        "--cache-blocks", str(args.cache_blocks), "--repeats", str(args.repeats),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert receiver.stdout is not None
    address = (await receiver.stdout.readline()).decode().strip()
    source = cache(args.cache_blocks)
    sender = IPCTransport()
    stamps = Stamps()
    rows = []
    for wait, strategy in WAITS.items():
        transfer_ipc.wait_for_copy = strategy  # type: ignore[assignment]
        for size, n in SIZES.items():
            runs = []
            for r in range(args.repeats + 1):
                stamps.marks.clear()
                start = time.perf_counter()
                ok = await sender.send_blocks(
                    address, TransferId(f"{wait}-{size}-{r}"), source, list(range(n))
                )
                end = time.perf_counter()
                assert ok
                if r:
                    runs.append(phases(start, end, stamps.marks))
            row = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            rows.append({"strategy": wait, "blocks": n, **row})
    await sender.close()
    assert await receiver.wait() == 0
    copy_ms = {n: gpu_copy_ms(source, n, args.repeats) for n in SIZES.values()}
    flat = torch.empty(512 * 2 * 2**20, dtype=torch.uint8, device="cuda")
    other = torch.empty_like(flat)
    other.copy_(flat)
    d2d = []
    for _ in range(args.repeats):
        before = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        after = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        before.record()
        other.copy_(flat)
        after.record()
        after.synchronize()
        d2d.append(float(before.elapsed_time(after)))
    return {"rows": rows, "gpu_copy_ms": copy_ms, "copy_1gib_ms": statistics.median(d2d)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="(internal) the receiver")
    parser.add_argument("--cache-blocks", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args))
        return
    result = asyncio.run(measure(args))
    keys = ["begin round trip", "launch", "wait", "done frame", "rest", "total"]
    print(f"{'waits':<7} {'blocks':>6} " + " ".join(f"{k[:12]:>12}" for k in keys) + "  (ms)")
    for row in result["rows"]:
        cells = " ".join(f"{row[k] * 1e3:>12.3f}" for k in keys)
        print(f"{row['strategy']:<7} {row['blocks']:>6} {cells}")
    print(f"fused copy on the GPU (events): {result['gpu_copy_ms']} ms")
    print(f"copy_() of 1 GiB: {result['copy_1gib_ms']:.3f} ms")
    write_gpu_result(result, args.out)


if __name__ == "__main__":
    main()
