"""KV transfer over CUDA IPC against a device-to-device copy of the same bytes (one GPU).

A receiver process (``--serve``, started by this one) holds a paged cache of
Llama-3.1-8B's shape (32 layers of K and V, blocks of 16 tokens x 8 KV heads x 128, bf16:
2 MiB per block over all layers) and shares it with ``kv.transport.cuda_ipc``; this process
sends ``--blocks`` blocks (default 512: an 8k-token prompt, 1 GiB) into its reserved
blocks with ``IPCTransport.send_blocks`` — consecutive block ids, then scattered ones
(random ids on both sides, as after a while of serving) — and, in the same run, times
``copy_()`` of one contiguous tensor of the same size on the device (the ceiling) and
the same block copies between two caches of this process (no IPC), fused (one Triton
launch over a table of rows: ``kv.gpu.block_copy``, what the transport uses, with its
layout found once as the transport keeps it per receiver) and tensor by tensor (the
copies before it). "begin -> gone" is one control round trip alone (a transfer the
receiver does not expect); the "in-process one block" rows are the transport's copy step
for one block on the event loop: until the launch is queued, and until the wait for its
event in a thread returns (so a one-block transfer ~ round trip + that + ``done``).
Each figure is the median of ``--repeats`` runs after a warm-up; a transfer's time
includes its control messages, the rows' trip to the device and the wait for the copy.
Rates are bytes moved / time.

With ``--transport ucxx`` the same transfers go over ``kv.transport.ucxx_blocks`` (UCX's
own path between the two processes' CUDA memory, received straight into the reserved
blocks), labelled "UCXX", written to ``disagg-ucxx-h200.json``.

    python -m bench.disaggregation.ipc_gpu          # on the H200 (gpu_serving.sh runs it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from dynask.kv.gpu.block_copy import (
    BlockLayout,
    block_runs,
    copy_blocks,
    copy_blocks_per_tensor,
    copy_rows,
    launch_blocks,
    row_table,
)
from dynask.kv.transfer import TransferId, make_transport
from dynask.kv.transport.control import ControlledBlockTransport

RESULTS = Path(__file__).resolve().parents[1] / "results"
OUTS = {"cuda_ipc": RESULTS / "disagg-ipc-h200.json", "ucxx": RESULTS / "disagg-ucxx-h200.json"}
LABELS = {"cuda_ipc": "CUDA IPC", "ucxx": "UCXX"}
LAYERS, BLOCK = 32, (16, 8, 128)


def cache(num_blocks: int) -> list[torch.Tensor]:
    return [
        torch.randn((num_blocks, *BLOCK), device="cuda").to(torch.bfloat16)
        for _ in range(2 * LAYERS)
    ]


def plans(args: argparse.Namespace) -> dict[str, tuple[list[int], list[int]]]:
    """Transfer id -> (source ids, destination ids); consecutive, then scattered, then one
    block (the fixed cost of a transfer: control messages, table, launch, sync)."""
    rng = random.Random(0)
    out = {}
    for r in range(args.repeats + 1):
        out[f"one-{r}"] = ([7], [9])
        out[f"contiguous-{r}"] = (list(range(args.blocks)), list(range(args.blocks)))
        out[f"claimed-{r}"] = (list(range(args.blocks)), list(range(args.blocks)))
        out[f"scattered-{r}"] = (
            rng.sample(range(args.cache_blocks), args.blocks),
            rng.sample(range(args.cache_blocks), args.blocks),
        )
        if args.transport == "ucxx":  # the contiguous blocks as one staged message
            out[f"staged-{r}"] = (list(range(args.blocks)), list(range(args.blocks)))
    return out


def block_transport(kind: str) -> ControlledBlockTransport:
    made = make_transport(kind, paged_cache=True)
    assert isinstance(made, ControlledBlockTransport)
    return made


async def serve(args: argparse.Namespace) -> None:
    receiver = block_transport(args.transport)
    receiver.share(cache(args.cache_blocks))
    address = await receiver.listen("127.0.0.1")
    futures = [
        receiver.expect_blocks(TransferId(tid), dst) for tid, (_, dst) in plans(args).items()
    ]
    print(address, flush=True)
    await asyncio.wait_for(asyncio.gather(*futures), 300)
    await asyncio.sleep(0.5)  # the last "done" is answered before the listener closes
    await receiver.close()


def short_case(path: str, label: str = "CUDA IPC") -> str:
    """The row's label in the PNG (``bench.common.plots`` labels rows by short strings)."""
    short_label = "IPC" if label == "CUDA IPC" else label
    path = path.replace(label, "CUDA IPC")  # the table below is written for CUDA IPC
    for long, short in (
        ("device copy_() of one tensor", "copy_ one tensor"),
        ("CUDA IPC, one block", "IPC one block"),
        ("CUDA IPC, begin -> gone", "IPC round trip"),
        ("CUDA IPC, contiguous (1 runs), claimed ahead", "IPC claimed ahead"),
        ("in-process one block: launch_blocks returns", "one block queued"),
        ("in-process one block: + event wait in a thread", "one block + wait"),
        ("CUDA IPC, ", "IPC "),
        ("in-process fused: launch only, ", "launch "),
        ("in-process fused, ", "fused "),
        ("in-process per tensor, ", "per-tensor "),
        ("row_table only, ", "table "),
    ):
        if path.startswith(long):
            short = short.replace("IPC", short_label, 1)
            return (short + path[len(long) :].split(" (")[0])[:24]
    return path[:24]


def timed(action: Any) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    action()
    torch.cuda.synchronize()
    return time.perf_counter() - start


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.disaggregation.ipc_gpu", "--serve",
        "--blocks", str(args.blocks), "--cache-blocks", str(args.cache_blocks),
        "--repeats", str(args.repeats), "--transport", args.transport,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert receiver.stdout is not None
    address = (await receiver.stdout.readline()).decode().strip()
    source = cache(args.cache_blocks)
    sender = block_transport(args.transport)
    label = LABELS[args.transport]
    times: dict[str, list[float]] = {
        "one": [], "contiguous": [], "claimed": [], "scattered": [], "gone": [], "staged": []
    }  # fmt: skip
    for r in range(args.repeats + 1):  # the first asks for the handles
        start = time.perf_counter()
        assert not await sender.send_blocks(address, TransferId(f"unexpected-{r}"), source, [7])
        if r:
            times["gone"].append(time.perf_counter() - start)
    for tid, (src, _) in plans(args).items():
        kind, repeat = tid.rsplit("-", 1)
        if kind == "claimed":  # the begin round trip made ahead, as during a prefill
            claim = await sender.claim(address, TransferId(tid), len(src))
            assert claim is not None
            start = time.perf_counter()
            await sender.write_claimed(claim, source, src)
            if repeat != "0":
                times[kind].append(time.perf_counter() - start)
            continue
        direct_max_runs = getattr(sender, "direct_max_runs", 0)
        if kind == "staged":
            sender.direct_max_runs = 0  # type: ignore[attr-defined]
        start = time.perf_counter()
        assert await sender.send_blocks(address, TransferId(tid), source, src)
        if kind == "staged":
            sender.direct_max_runs = direct_max_runs  # type: ignore[attr-defined]
        if repeat != "0":  # the first of each kind is the warm-up (handles opened)
            times[kind].append(time.perf_counter() - start)
    await sender.close()
    assert await receiver.wait() == 0
    nbytes = args.blocks * 2 * LAYERS * source[0][0].numel() * source[0].element_size()
    flat_src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    flat_dst = torch.empty_like(flat_src)
    flat_dst.copy_(flat_src)
    d2d = statistics.median(timed(lambda: flat_dst.copy_(flat_src)) for _ in range(args.repeats))
    local = cache(args.cache_blocks)
    plan = plans(args)
    local_times: dict[tuple[str, str], float] = {}
    for kind in ("contiguous", "scattered"):
        src, dst = plan[f"{kind}-1"]
        table = row_table(source, src, local, dst)
        layout = BlockLayout.of(source, local)
        assert table is not None and layout is not None
        steps = (
            ("fused", lambda s=src, d=dst, lay=layout: copy_blocks(source, s, local, d, lay)),
            ("per tensor", lambda s=src, d=dst: copy_blocks_per_tensor(source, s, local, d)),
            ("fused: launch only", lambda t=table: copy_rows(t, source[0], local[0])),
        )
        for name, action in steps:
            action()
            local_times[kind, name] = statistics.median(timed(action) for _ in range(args.repeats))
        local_times[kind, "fused: table only"] = statistics.median(
            timed(lambda s=src, d=dst: row_table(source, s, local, d)) for _ in range(args.repeats)
        )
    queued, waited = await one_block_in_process(source, local, args.repeats)
    rows: list[dict[str, Any]] = [{"path": "device copy_() of one tensor", "s": d2d}]
    for kind in ("contiguous", "scattered"):
        runs = len(block_runs(*plan[f"{kind}-1"]))
        rows.append({"path": f"{label}, {kind} ({runs} runs)", "s": statistics.median(times[kind])})
        if kind == "contiguous":
            rows.append(
                {
                    "path": f"{label}, contiguous ({runs} runs), claimed ahead",
                    "s": statistics.median(times["claimed"]),
                }
            )
            if times["staged"]:
                rows.append(
                    {
                        "path": f"{label}, contiguous ({runs} runs), staged",
                        "s": statistics.median(times["staged"]),
                    }
                )
        for name in ("fused", "fused: launch only", "per tensor"):
            rows.append({"path": f"in-process {name}, {kind}", "s": local_times[kind, name]})
    for row in rows:
        row["GB/s"] = nbytes / row["s"] / 1e9
        row["of_copy"] = d2d / row["s"]
    # Fixed costs, no rate: one block over IPC; planning the table on the CPU.
    rows.append({"path": f"{label}, one block", "s": statistics.median(times["one"])})
    rows.append({"path": f"{label}, begin -> gone", "s": statistics.median(times["gone"])})
    rows.append({"path": "in-process one block: launch_blocks returns", "s": queued})
    rows.append({"path": "in-process one block: + event wait in a thread", "s": waited})
    for kind in ("contiguous", "scattered"):
        rows.append(
            {"path": f"row_table only, {kind}", "s": local_times[kind, "fused: table only"]}
        )
    for row in rows:
        row.setdefault("GB/s", None)
        row["case"] = short_case(row["path"], label)
    return {"bytes": nbytes, "blocks": args.blocks, "transport": args.transport, "rows": rows}


async def one_block_in_process(
    source: list[torch.Tensor], local: list[torch.Tensor], repeats: int
) -> tuple[float, float]:
    """The transport's copy step for one block, as it runs on the event loop (the layout
    reused): until ``launch_blocks`` returns (rows on the device, the launch, the
    event), and until its event's wait in a thread returns."""
    layout = BlockLayout.of(source, local)
    queued, waited = [], []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        started = launch_blocks(source, [7], local, [9], layout)
        queued.append(time.perf_counter() - start)
        await asyncio.to_thread(started.wait)
        waited.append(time.perf_counter() - start)
    return statistics.median(queued[1:]), statistics.median(waited[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="(internal) the receiver")
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--cache-blocks", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--transport", choices=sorted(OUTS), default="cuda_ipc")
    parser.add_argument("--out", type=Path, default=None, help="default: by transport")
    args = parser.parse_args(argv)
    args.out = args.out or OUTS[args.transport]
    if args.serve:
        asyncio.run(serve(args))
        return
    result = asyncio.run(measure(args))
    print(f"{result['bytes'] / 2**30:.2f} GiB ({args.blocks} blocks of 2 MiB) per transfer")
    print(f"{'path':<48} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    for row in result["rows"]:
        rate = "" if row["GB/s"] is None else f"{row['GB/s']:>8.1f} {row['of_copy']:>8.0%}"
        print(f"{row['path']:<48} {row['s'] * 1e3:>8.3f} {rate}")
    write_gpu_result(result, args.out)


def write_gpu_result(result: dict[str, Any], out: Path) -> None:
    """Writes ``result`` as JSON with the time, the GPU's name and torch's version."""
    result.update(
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
