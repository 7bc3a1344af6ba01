"""Where CUDA IPC works between Dask workers: the cuda_ipc transport's calls inside a real
``LocalCluster`` (Nanny-spawned worker processes), started as ``dynask run`` starts them.

Issue 20: inside ``dynask run`` every remote prefill over ``cuda_ipc`` failed with
``CUDA error: invalid device context`` in torch's ``rebuild_cuda_tensor``, while two plain
processes passed. Each case below runs on a real cluster, with a cache-holding actor per
worker (8 bf16 tensors of Llama-3.1-8B's block shape), and prints whether it passed:

- ``pinned``: two workers with ``dynask run --engines-per-gpu 2``'s placement env
  (``PinnedLocalCluster``, ``CUDA_VISIBLE_DEVICES`` from ``gpu_placement``); worker B's
  actor copies blocks into worker A's reserved ones through ``IPCTransport`` (fused copy;
  the copy thread is a pool thread of B's event loop), checked block by block.
- ``plain``: the same on a ``LocalCluster`` without the env.
- ``loop``: B opens A's handles with torch's own calls on its actor's event loop.
- ``thread``: the same in a fresh thread that never ran CUDA work.
- ``own-raw``: an actor opens, with torch's own calls, the handles it shared itself: what
  the prefill actor did when it served a request alone and sent the KV to itself.
- ``own-transport``: the same through ``IPCTransport.send_blocks``: refused by name.

    python -m bench.disaggregation.ipc_worker_check        # on the H200 (gpu_serving.sh)
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import traceback
from typing import Any

import torch
from distributed import Client, LocalCluster
from torch.multiprocessing.reductions import reduce_tensor

from dynask.actors.runtime.gpu_discovery import discover_gpus
from dynask.control_plane.cluster.gpu_placement import PinnedLocalCluster, place_workers
from dynask.kv.transfer import TransferId
from dynask.kv.transport.cuda_ipc import IPCTransport

BLOCKS, TENSORS, SHAPE = 256, 8, (16, 8, 128)
SRC_IDS, DST_IDS = [5, 6, 7, 100, 3, 200], [10, 11, 12, 40, 250, 0]


class CacheHolder:
    """A Dask actor holding a paged cache on its worker's ``cuda:0``, shared over IPC."""

    def __init__(self, seed: int | None) -> None:
        generator = torch.Generator().manual_seed(seed or 0)
        device = os.environ.get("IPC_CHECK_DEVICE", "cuda")  # cpu: a smoke run of the cases
        self.caches = [
            (torch.randn((BLOCKS, *SHAPE), generator=generator) if seed is not None
             else torch.full((BLOCKS, *SHAPE), -1.0)).to(torch.bfloat16).to(device)
            for _ in range(TENSORS)
        ]  # fmt: skip
        if device == "cuda":
            torch.cuda.synchronize()
        self.transport = IPCTransport()
        self.transport.share(self.caches)
        self.raw = pickle.dumps([reduce_tensor(t) for t in self.caches])
        self.arrived: dict[str, asyncio.Future[None]] = {}

    async def listen(self) -> dict[str, Any]:
        address = await self.transport.listen("127.0.0.1")
        return {"address": address, "pid": os.getpid(),
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}  # fmt: skip

    async def raw_handles(self) -> bytes:
        return self.raw

    async def expect(self, transfer_id: str, ids: list[int]) -> None:
        self.arrived[transfer_id] = self.transport.expect_blocks(TransferId(transfer_id), ids)

    async def wait(self, transfer_id: str) -> None:
        await asyncio.wait_for(self.arrived.pop(transfer_id), 30)

    async def send(self, address: str, transfer_id: str, ids: list[int]) -> bool:
        return await self.transport.send_blocks(address, TransferId(transfer_id), self.caches, ids)

    async def blocks(self, ids: list[int]) -> bytes:
        return pickle.dumps([t[ids].cpu() for t in self.caches])

    async def open_raw(self, handles: bytes, where: str) -> list[float]:
        """Opens ``handles`` with torch's rebuild on the event loop or a fresh thread;
        the sum of each opened tensor's first block."""
        if where == "loop":
            return _open_and_sum(handles)
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(_catch(_open_and_sum, handles)))
        thread.start()
        await asyncio.to_thread(thread.join)
        if isinstance(result[0], BaseException):
            raise result[0]
        return list(result[0])

    async def sums(self) -> list[float]:
        return [float(t[0].float().sum()) for t in self.caches]


def _open_and_sum(handles: bytes) -> list[float]:
    tensors = [rebuild(*args) for rebuild, args in pickle.loads(handles)]
    return [float(t[0].float().sum()) for t in tensors]


def _catch(function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except BaseException as exc:  # handed to the awaiting coroutine, which re-raises it
        return exc


async def holders(client: Client) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    workers = sorted((await client.scheduler.identity(n_workers=-1))["workers"])  # type: ignore[union-attr]
    a = await client.submit(CacheHolder, None, actor=True, workers=[workers[0]], pure=False)
    b = await client.submit(CacheHolder, 3, actor=True, workers=[workers[1]], pure=False)
    return a, b, await a.listen(), await b.listen()


async def cross_copy(a: Any, b: Any, info_a: dict[str, Any], tag: str) -> str:
    await a.expect(tag, DST_IDS)
    sent = await b.send(info_a["address"], tag, SRC_IDS)
    await a.wait(tag)
    got = pickle.loads(await a.blocks(DST_IDS))
    want = pickle.loads(await b.blocks(SRC_IDS))
    same = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    return f"sent={sent}, {len(SRC_IDS)} blocks x {TENSORS} tensors equal: {same}"


async def run_cases(cluster: LocalCluster, names: list[str]) -> dict[str, str]:
    results: dict[str, str] = {}
    async with Client(cluster, asynchronous=True) as client:  # type: ignore[no-untyped-call]
        a, b, info_a, info_b = await holders(client)
        results["env"] = f"A {info_a}; B {info_b}"
        for name in names:
            try:
                if name in ("pinned", "plain"):
                    results[name] = await cross_copy(a, b, info_a, name)
                elif name in ("loop", "thread"):
                    opened = await b.open_raw(await a.raw_handles(), name)
                    results[name] = f"opened; sums equal A's: {opened == await a.sums()}"
                elif name == "own-raw":
                    opened = await a.open_raw(await a.raw_handles(), "loop")
                    results[name] = f"opened (unexpected): {opened[:2]}"
                elif name == "own-transport":
                    await a.expect("own", DST_IDS)
                    results[name] = f"sent={await a.send(info_a['address'], 'own', SRC_IDS)}"
            except Exception as exc:
                results[name] = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0]}"
                traceback.print_exc()
    return results


async def main() -> None:
    options: dict[str, Any] = {"processes": True, "asynchronous": True,
                               "dashboard_address": None, "threads_per_worker": 2}  # fmt: skip
    placements = place_workers(2, discover_gpus(), engines_per_gpu=2)
    print("placements:", [p.env for p in placements], flush=True)
    results: dict[str, str] = {}
    if not placements:  # no GPU: a smoke run of the plain case
        os.environ["IPC_CHECK_DEVICE"] = "cpu"
    async with (
        PinnedLocalCluster(placements, **options)
        if placements
        else LocalCluster(n_workers=0, **options)  # type: ignore[no-untyped-call]
    ) as cluster:
        await cluster.scale(2)  # type: ignore[no-untyped-call]
        await cluster.wait_for_workers(2)  # type: ignore[no-untyped-call]
        # Raw opens first: a later open of handles still open in the process is a cache hit.
        pinned = await run_cases(cluster, ["loop", "thread", "pinned", "own-transport", "own-raw"])
        results.update({f"{k} (pinned env)" if k == "env" else k: v for k, v in pinned.items()})
    async with LocalCluster(n_workers=2, **options) as cluster:  # type: ignore[no-untyped-call]
        plain = await run_cases(cluster, ["plain"])
        results.update({f"{k} (no env)" if k == "env" else k: v for k, v in plain.items()})
    print(f"\n{'case':<22} result")
    for name, outcome in results.items():
        print(f"{name:<22} {outcome}")


if __name__ == "__main__":
    asyncio.run(main())
