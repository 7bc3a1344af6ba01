"""What a cuda_ipc transfer costs besides the copy: its Python control, on a CPU.

The same transport as on a GPU (``kv.transport.cuda_ipc``), with the receiver's paged cache in
POSIX shared memory (64 tensors, Llama-3.1-8B's layer count, tiny blocks so the copy is
negligible): a receiver process (``--serve``, started by this one) expects one-block
transfers, this process sends them. Rows, each the median of ``--repeats`` after a
warm-up: a whole one-block transfer (handles opened once; ``begin`` round trip, the copy
in a thread, ``done``); a zero-block transfer (the same control, no copy: on a GPU it is
what a transfer costs besides the launch and the copy itself); ``begin -> gone`` (one
control round trip alone: an id the receiver does not expect); an ``asyncio.to_thread``
hop that does nothing (what a transfer pays to wait off the event loop; on a GPU it now
overlaps the copy). These are this CPU's numbers: the GPU host's are the "one block" and
"begin -> gone" rows of ``bench.disaggregation.ipc_gpu``.

    .venv/bin/python -m bench.disaggregation.ipc_control
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from dynask.kv.transfer import TransferId
from dynask.kv.transport.cuda_ipc import IPCTransport

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "disagg-ipc-control-cpu.json"
TENSORS, BLOCK = 64, (4, 2, 8)


def cache() -> list[torch.Tensor]:
    return [torch.zeros((16, *BLOCK)) for _ in range(TENSORS)]


async def serve(repeats: int) -> None:
    receiver = IPCTransport()
    receiver.share(cache())
    address = await receiver.listen("127.0.0.1")
    futures = [
        receiver.expect_blocks(TransferId(f"{kind}{r}"), ids)
        for r in range(repeats + 1)
        for kind, ids in (("t", [9]), ("z", []))
    ]
    print(address, flush=True)
    await asyncio.wait_for(asyncio.gather(*futures), 120)
    await asyncio.sleep(0.3)
    await receiver.close()


async def median_of(repeats: int, action: Any) -> float:
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        await action(r)
        if r:  # the first is the warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


async def measure(repeats: int) -> list[dict[str, Any]]:
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.disaggregation.ipc_control", "--serve",
        "--repeats", str(repeats), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert receiver.stdout is not None
    address = (await receiver.stdout.readline()).decode().strip()
    source, sender = cache(), IPCTransport()

    async def gone(r: int) -> None:
        assert not await sender.send_blocks(address, TransferId(f"nobody-{r}"), source, [7])

    async def one_block(r: int) -> None:
        assert await sender.send_blocks(address, TransferId(f"t{r}"), source, [7])

    async def zero_blocks(r: int) -> None:
        assert await sender.send_blocks(address, TransferId(f"z{r}"), source, [])

    async def hop(_: int) -> None:
        await asyncio.to_thread(lambda: None)

    rows = [
        {"path": "begin -> gone (one round trip)", "s": await median_of(repeats, gone)},
        {"path": "one-block transfer", "s": await median_of(repeats, one_block)},
        {"path": "zero-block transfer", "s": await median_of(repeats, zero_blocks)},
        {"path": "asyncio.to_thread hop", "s": await median_of(repeats, hop)},
    ]
    await sender.close()
    assert await receiver.wait() == 0
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="(internal) the receiver")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.repeats))
        return
    rows = asyncio.run(measure(args.repeats))
    print(f"{'path (CPU, shared memory)':<34} {'ms':>8}")
    for row in rows:
        print(f"{row['path']:<34} {row['s'] * 1e3:>8.3f}")
    result = {
        "rows": rows,
        "repeats": args.repeats,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
