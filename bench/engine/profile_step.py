"""Where a decode step's time goes on a GPU (a diagnostic for issue 8, not a benchmark).

Builds the random Llama-3.1-8B-shaped engine of ``bench/engine/throughput.py`` (no HF), then:

1. the GPU time of one CUDA-graph replay per batch bucket, with every row at a 576-token
   context, against the memory floor;
2. the kernels of one replay (torch profiler), the slowest first;
3. the host-side split of real engine steps in a decode phase: schedule, input plan,
   replay, sampling (incl. the one sync), postprocess and deltas.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Any

import torch

from bench.engine import cuda as engine_cuda
from bench.engine import throughput as bench
from bench.engine.args import parse_args
from dynask.actors.engine import model_runner, step_plan


def replay_ms(graphs: Any, batch: int, blocks: int, reps: int = 20) -> float:
    graphs._lens[:batch] = 576
    graphs._tables[:batch, :36] = torch.arange(batch * 36, device="cuda").view(batch, 36) % blocks
    graphs._graphs[batch].replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graphs._graphs[batch].replay()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end) / reps)


def profile_kernels(graphs: Any, batch: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graphs._graphs[batch].replay()
        torch.cuda.synchronize()
    print(f"--- kernels of one replay at batch {batch}")
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60)
    )


def timed(owner: Any, name: str, totals: dict[str, float], sync: bool = False) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original(*args, **kwargs)
        if sync:
            torch.cuda.synchronize()
        totals[name] += time.perf_counter() - start
        return result

    setattr(owner, name, wrapper)


def step_split(engine: Any, batch: int, new_tokens: int = 48) -> None:
    totals: dict[str, float] = defaultdict(float)
    runner = engine.parts.runner
    timed(engine.scheduler, "schedule", totals)
    timed(engine.scheduler, "postprocess", totals)
    timed(engine, "_delta", totals)
    timed(step_plan.StepPlan, "build", totals)
    timed(runner.graphs, "replay", totals, sync=True)
    timed(model_runner, "sample", totals)
    prompts = bench.random_prompts(batch, 512, 77 + batch)
    streams = [engine.add_request(p, bench.greedy(new_tokens)) for p in prompts]
    while not all(s.token_ids for s in streams):
        engine.step()
    totals.clear()
    steps, start = 0, time.perf_counter()
    while not all(s.finished for s in streams):
        engine.step()
        steps += 1
    wall = (time.perf_counter() - start) / steps * 1e3
    parts = ", ".join(f"{k} {v / steps * 1e3:.2f}" for k, v in totals.items())
    print(f"batch {batch}: step {wall:.2f} ms = {parts} (ms/step)")


def profile_mixed_steps(engine: Any, batch: int) -> None:
    """The prefill phase of a batch (steps that mix decode rows and prefill chunks)."""
    from torch.profiler import ProfilerActivity, profile

    prompts = bench.random_prompts(batch, 512, 99 + batch)
    streams = [engine.add_request(p, bench.greedy(4)) for p in prompts]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            start = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            print(f"mixed step {(time.perf_counter() - start) * 1e3:.1f} ms")
    while not all(s.finished for s in streams):
        engine.step()
    table = prof.key_averages()
    print(table.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))
    print(table.table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=50))


@torch.inference_mode()
def main() -> None:
    config, _ = parse_args([*sys.argv[1:], "--skip-hf", "--device", "cuda"])
    engine, _ = bench.build_engine(config)
    runner: Any = engine.parts.runner
    if config.batches == (64,):
        bench.warm_up(engine, None, 512)
        profile_mixed_steps(engine, 64)
        return
    bandwidth = engine_cuda.copy_bandwidth(torch.device("cuda"))
    kv_token = engine.parts.model_config.kv_bytes_per_token(runner.spec.dtype)
    for batch in config.batches:
        gpu = replay_ms(runner.graphs, batch, engine.parts.plan.num_blocks)
        floor = engine_cuda.decode_floor(runner.model, kv_token, batch, 576, bandwidth)
        print(f"replay batch {batch:>3}: {gpu:.3f} ms GPU, floor {floor.seconds * 1e3:.3f} ms")
    profile_kernels(runner.graphs, config.batches[0])
    profile_kernels(runner.graphs, config.batches[-1])
    for batch in config.batches:
        step_split(engine, batch)


if __name__ == "__main__":
    main()
