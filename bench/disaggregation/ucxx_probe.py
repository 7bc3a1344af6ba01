"""Which set-up lets a ucxx block transfer between two GPU processes run (one H200).

The first ucxx run of ``ipc_gpu --transport ucxx`` and of the stack check died in the
sender (SIGSEGV, no Python traceback) on its first write, while the CUDA test's sender
(which imports UCXX before it allocates CUDA memory) wrote fine. This probe runs one
receiver and one sender process per variant, each sender writing one block and then 32
contiguous blocks of 64 bf16 cache tensors, with ``faulthandler`` on, and prints how
each ended:

- ``as-is``: CUDA memory first, then the transport (what the engine actors do);
- ``ucxx-first``: ``import ucxx`` (and its libraries) before any CUDA allocation;
- ``no-mem-events``: as-is with ``UCX_MEM_EVENTS=no`` (UCM's CUDA memory hooks off);
- ``blocking``: as-is with ``UCXPY_PROGRESS_MODE=blocking`` (no progress thread).

    python -m bench.disaggregation.ucxx_probe       (gpu_serving.sh's `ucxx_probe` part)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from typing import Any

VARIANTS = {
    "as-is": {},
    "ucxx-first": {"PROBE_IMPORT_FIRST": "1"},
    "no-mem-events": {"UCX_MEM_EVENTS": "no"},
    "blocking": {"UCXPY_PROGRESS_MODE": "blocking"},
}
LAYERS, BLOCK, CACHE_BLOCKS = 32, (16, 8, 128), 256
PLAN = {"one": ([7], [9]), "run": (list(range(32)), list(range(100, 132)))}


def caches() -> list[Any]:
    import torch

    return [
        torch.randn((CACHE_BLOCKS, *BLOCK), device="cuda").to(torch.bfloat16)
        for _ in range(2 * LAYERS)
    ]


async def receive() -> None:
    from dynask.kv.transfer import make_transport

    mine = caches()
    receiver = make_transport("ucxx", paged_cache=True)
    receiver.share(mine)  # type: ignore[union-attr]
    address = await receiver.listen("127.0.0.1")
    futures = [receiver.expect_blocks(tid, dst) for tid, (_, dst) in PLAN.items()]  # type: ignore[union-attr, arg-type]
    print(address, flush=True)
    await asyncio.wait_for(asyncio.gather(*futures), 60)
    await asyncio.sleep(0.3)
    await receiver.close()
    print("received", flush=True)


async def send(address: str) -> None:
    if os.environ.get("PROBE_IMPORT_FIRST"):
        import ucxx  # noqa: F401

    source = caches()
    from dynask.kv.transfer import TransferId, make_transport

    sender = make_transport("ucxx", paged_cache=True)
    for tid, (src, _) in PLAN.items():
        ok = await sender.send_blocks(address, TransferId(tid), source, src)  # type: ignore[union-attr, arg-type]
        print(f"sent {tid}: {ok}", flush=True)
    await sender.close()


def run_variant(name: str, extra: dict[str, str]) -> str:
    env = {**os.environ, **extra}
    python = [sys.executable, "-X", "faulthandler", "-m", "bench.disaggregation.ucxx_probe"]
    receiver = subprocess.Popen(
        [*python, "--role", "receive"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    address = receiver.stdout.readline().strip()
    try:
        sender = subprocess.run(
            [*python, "--role", "send", "--address", address],
            env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        sender_end = f"rc {sender.returncode}; {sender.stdout.strip()!r}"
        tail = sender.stderr.strip().splitlines()[-25:]
    except subprocess.TimeoutExpired:
        sender_end, tail = "timed out", []
    try:
        out, _ = receiver.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        receiver.kill()
        out, _ = receiver.communicate()
    report = f"== {name}: sender {sender_end}; receiver rc {receiver.returncode} {out.strip()!r}"
    return "\n".join([report, *tail])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("probe", "receive", "send"), default="probe")
    parser.add_argument("--address", default="")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    if args.role == "receive":
        asyncio.run(receive())
    elif args.role == "send":
        asyncio.run(send(args.address))
    else:
        for name in args.variants.split(","):
            print(run_variant(name, VARIANTS[name]), flush=True)


if __name__ == "__main__":
    main()
