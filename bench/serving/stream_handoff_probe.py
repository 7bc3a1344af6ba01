"""Why tokens reach clients in bursts on a GPU: the engine thread's hand-off to a loop.

In ``dynask run`` the engine thread publishes each step's deltas to the token stream by
``loop.call_soon_threadsafe`` onto the Dask worker's event loop, which writes the frame.
This probe runs the same engine on its thread (``Engine.start``) with an asyncio loop in
the main thread standing in for the worker's, and stamps each step twice: when the
engine thread publishes it and when the loop runs the hand-off. Gaps between consecutive
stamps of each kind (p50/p99/max) and the hand-off delay, per setting in the same run:
Python's GIL switch interval (5 ms by default) and, a run each, asynchronous
scheduling on or off (``--async-scheduling``).

    python3 -m bench.serving.stream_handoff_probe --tokenizer .devcarry/tokenizer
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.engine.report import BenchConfig
from bench.engine.throughput import build_engine, greedy, random_prompts, warm_up

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "stream-handoff-h200.json"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


class HandOff:
    """The engine's output listener: each step with tokens handed to the probe's loop."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.published: list[float] = []
        self.handed: list[float] = []

    def __call__(self, outputs: list[Any]) -> None:
        loop = self.loop
        if loop is not None and any(o.token_ids for o in outputs):
            loop.call_soon_threadsafe(self._on_loop, time.perf_counter())

    def _on_loop(self, stamp: float) -> None:
        self.handed.append(time.perf_counter())
        self.published.append(stamp)


async def probe(engine: Any, hand_off: HandOff, clients: int, new_tokens: int, seed: int):
    hand_off.published, hand_off.handed = [], []
    hand_off.loop = asyncio.get_running_loop()
    try:
        streams = [
            engine.add_request(p, greedy(new_tokens)) for p in random_prompts(clients, 512, seed)
        ]
        while not all(s.finished for s in streams):
            await asyncio.sleep(0.002)  # the loop stays live, as a worker's does
    finally:
        hand_off.loop = None
    published, handed = hand_off.published, hand_off.handed
    pub_gaps = list(np.diff(published[2:]))
    hand_gaps = list(np.diff(handed[2:]))
    delays = [h - p for p, h in zip(published, handed, strict=True)]
    return {
        "steps": len(published),
        "publish_gap_p50_ms": pct(pub_gaps, 50),
        "publish_gap_p99_ms": pct(pub_gaps, 99),
        "handoff_gap_p50_ms": pct(hand_gaps, 50),
        "handoff_gap_p99_ms": pct(hand_gaps, 99),
        "handoff_gap_max_ms": pct(hand_gaps, 100),
        "handoff_delay_p50_ms": pct(delays, 50),
        "handoff_delay_p99_ms": pct(delays, 99),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--random-model", default="llama-8b")
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--async-scheduling", default="on", choices=("on", "off"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    config = BenchConfig(
        batches=(1,), prompt_len=512, new_tokens=args.new_tokens, ttft_prompt_len=512,
        ttft_trials=1, repeats=1, threads=16, skip_hf=True, device=args.device,
        random_model=args.random_model, tokenizer=args.tokenizer, max_num_seqs=64,
        max_batched_tokens=2048, gpu_memory_utilization=0.5,
    )  # fmt: skip
    rows = []
    # One setting per process: a second engine here would be charged for the first's memory.
    async_on = args.async_scheduling == "on"
    engine, _ = build_engine(replace(config, async_scheduling=args.async_scheduling))
    warm_up(engine, None, 512)
    hand_off = HandOff()
    engine.add_output_listener(hand_off)
    engine.start()
    for interval in (0.005, 0.0005):
        sys.setswitchinterval(interval)
        for clients in (int(c) for c in args.clients.split(",")):
            row = asyncio.run(probe(engine, hand_off, clients, args.new_tokens, 11 + clients))
            row = {"async": async_on, "switch_ms": interval * 1e3, "clients": clients, **row}
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)  # fmt: skip
    sys.setswitchinterval(0.005)
    engine.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
