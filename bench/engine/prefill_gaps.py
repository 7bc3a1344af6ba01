"""Where a long prefill's wall time goes on a GPU: kernels, and the GPU idle between them.

A diagnostic for issue 19's prefill goal (≥ 80% of the bf16 matrix rate at 8,192 tokens),
not a benchmark. Builds the random Llama-3.1-8B-shaped engine of ``bench.engine.throughput``
(no HF), warms a fresh prompt of each length up, then per length:

1. the wall time of ``engine.generate`` of a fresh prompt (one token), median of trials,
   as ``bench.engine.cuda.measure_prefill`` takes it;
2. one such call under the torch profiler: the GPU's busy time (the union of its kernels
   and copies), the idle time before the first kernel and after the last one (host work:
   admission, the step's inputs, sampling, postprocess), and the largest idle gaps
   between kernels with the kernels on either side;
3. the host phases of that call (schedule, input plan, inputs to the device, forward
   launch, sampling, postprocess), timed around each call.

    python3 -m bench.engine.prefill_gaps --random-model llama-8b --tokenizer TOK \\
        --prefill-lens 8192 --max-batched-tokens 8192
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import torch

from bench.engine import throughput as bench
from bench.engine.args import parse_args
from bench.engine.profile_step import timed
from dynask.actors.engine import model_runner, step_plan


def _merged(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str, str]]:
    """Busy spans (start, end, first kernel, last kernel) from overlapping intervals."""
    spans: list[tuple[float, float, str, str]] = []
    for start, end, name in sorted(intervals):
        if spans and start <= spans[-1][1]:
            first_start, last_end, first, last = spans[-1]
            spans[-1] = (first_start, max(last_end, end), first, name if end >= last_end else last)
        else:
            spans.append((start, end, name, name))
    return spans


def profile_one(engine: Any, prompt: list[int]) -> None:
    from torch.autograd import DeviceType  # type: ignore[attr-defined]
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("generate"):
            engine.generate([prompt], bench.greedy(1))
        torch.cuda.synchronize()
    events = prof.events()
    call = next(e for e in events if e.name == "generate")
    device = [
        (e.time_range.start, e.time_range.end, e.name[:60])
        for e in events
        if e.device_type == DeviceType.CUDA
    ]
    spans = _merged(device)
    busy = sum(end - start for start, end, _, _ in spans)
    wall = call.time_range.end - call.time_range.start
    lead = spans[0][0] - call.time_range.start
    tail = call.time_range.end - spans[-1][1]
    gaps = [
        (later[0] - earlier[1], earlier[3], later[2])
        for earlier, later in itertools.pairwise(spans)
    ]
    inner = sum(g for g, _, _ in gaps)
    print(
        f"prefill {len(prompt)} (profiled): wall {wall / 1e3:.2f} ms, GPU busy {busy / 1e3:.2f} ms "
        f"in {len(device)} device ops; idle before the first {lead / 1e3:.2f} ms, after the "
        f"last {tail / 1e3:.2f} ms, between them {inner / 1e3:.2f} ms in {len(gaps)} gaps"
    )
    for gap, before, after in sorted(gaps, reverse=True)[:10]:
        print(f"  gap {gap:8.1f} us after {before} before {after}")


def host_phases(engine: Any, prompt: list[int]) -> None:
    totals: dict[str, float] = defaultdict(float)
    timed(engine.scheduler, "schedule", totals)
    timed(engine.scheduler, "postprocess", totals)
    timed(step_plan.StepPlan, "build", totals)
    timed(model_runner, "build_cuda_inputs", totals)
    timed(model_runner, "sample", totals)
    timed(engine.parts.runner, "_logits", totals)
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.generate([prompt], bench.greedy(1))
    wall = (time.perf_counter() - start) * 1e3
    parts = ", ".join(f"{name} {seconds * 1e3:.2f}" for name, seconds in totals.items())
    print(
        f"prefill {len(prompt)} host phases: wall {wall:.2f} ms = {parts} (ms; _logits holds "
        f"the forward's launches and, when nothing waits, not its GPU time)"
    )


@torch.inference_mode()
def main() -> None:
    config, _ = parse_args([*sys.argv[1:], "--skip-hf", "--device", "cuda"])
    engine, _ = bench.build_engine(config)
    for length in config.prefill_lens or (8192,):
        prompts = bench.random_prompts(8, length, 1234 + length)
        engine.generate(prompts[:2], bench.greedy(1))  # warm-up: compiles, cuDNN plans
        walls = []
        for prompt in prompts[2:6]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.generate([prompt], bench.greedy(1))
            walls.append((time.perf_counter() - start) * 1e3)
        median = statistics.median(walls)
        trials = ", ".join(f"{w:.1f}" for w in walls)
        print(
            f"prefill {length}: wall {median:.2f} ms median of {len(walls)} "
            f"({length / median * 1e3:,.0f} tok/s); trials {trials}"
        )
        profile_one(engine, prompts[6])
        host_phases(engine, prompts[7])


if __name__ == "__main__":
    main()
