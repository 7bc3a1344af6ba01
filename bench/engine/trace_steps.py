"""Where a GPU's decode steps and prefills lose time outside their kernels (a diagnostic
for issue 19).

    python -m bench.engine.trace_steps --random-model llama-8b --tokenizer T \\
        --batches 256 --prompt-len 512 --new-tokens 128 --max-batched-tokens 8192 \\
        [--prefill-lens 8192]

Runs each batch as ``bench.engine.throughput`` does; once every row has its first token it
records ``STEPS`` engine steps with the torch profiler (GPU activity only: the host is
not slowed by recording) and prints the wall time per step, the GPU's busy time (the
union of its kernels' and copies' intervals), and the longest idle gaps with the kernels on
either side: a gap after the last kernel of a step is the GPU waiting for the host.
With ``--prefill-lens``, one fresh prompt of each length (``engine.generate``, one token,
as ``bench.engine.throughput`` times prefill) is recorded with the host too: how long the
host works before the first kernel, the GPU's busy time, and after the last kernel.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from bench.engine import throughput as bench
from bench.engine.args import parse_args

STEPS = 24


def _intervals(prof: Any) -> list[tuple[float, float, str]]:
    spans = []
    for event in prof.events():
        # (a record_function range has a GPU twin spanning its kernels: not a kernel)
        if event.device_type.name == "CUDA" and event.name != "prefill":
            spans.append((event.time_range.start, event.time_range.end, event.name))
    return sorted(spans)


def report(spans: list[tuple[float, float, str]], steps: int) -> None:
    busy, gaps = 0.0, []
    end = spans[0][0]
    before = ""
    for start, stop, name in spans:
        if start > end:
            gaps.append((start - end, before, name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, before = stop, name
    wall = end - spans[0][0]
    print(
        f"{steps} steps: GPU span {wall / steps / 1e3:.3f} ms/step, busy "
        f"{busy / steps / 1e3:.3f}, idle {(wall - busy) / steps / 1e3:.3f} "
        f"({len(gaps)} gaps)"
    )
    for gap, before, after in sorted(gaps, reverse=True)[:8]:
        print(f"  gap {gap:8.1f} us after {before[:50]!r} before {after[:50]!r}")
    by_name: dict[str, list[float]] = {}
    for start, stop, name in spans:
        by_name.setdefault(name, []).append(stop - start)
    print("  per step: us, count, name (the busiest 24)")
    for name, times in sorted(by_name.items(), key=lambda item: -sum(item[1]))[:24]:
        print(f"  {sum(times) / steps:9.1f} {len(times) / steps:6.1f}  {name[:90]}")


def trace_prefill(engine: Any, length: int) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    for trial in range(2):  # the first compiles and warms this length
        prompt = bench.random_prompts(1, length, 1000 + trial)[0]
        torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=activities) as prof, record_function("prefill"):
            engine.generate([prompt], bench.greedy(1))
    marker = next(e for e in prof.events() if e.name == "prefill")
    spans = _intervals(prof)
    first, last = spans[0][0], max(stop for _, stop, _ in spans)
    start, end = marker.time_range.start, marker.time_range.end
    print(
        f"prefill {length}: {(end - start) / 1e3:.2f} ms, first kernel at "
        f"+{(first - start) / 1e3:.2f} ms, last ends {(end - last) / 1e3:.2f} ms before the end"
    )
    report(spans, 1)
    cpu = [e for e in prof.key_averages() if e.cpu_time_total > 0]
    print("  host ops by self time (ms): the 12 longest")
    for event in sorted(cpu, key=lambda e: -e.self_cpu_time_total)[:12]:
        print(f"  {event.self_cpu_time_total / 1e3:8.2f} {event.count:5}  {event.key[:80]}")


@torch.inference_mode()
def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    steps = STEPS
    config, _ = parse_args([*sys.argv[1:], "--skip-hf", "--device", "cuda"])
    engine, _ = bench.build_engine(config)
    bench.warm_up(engine, None, config.prompt_len)
    for batch in config.batches:
        prompts = bench.random_prompts(batch, config.prompt_len, 7 + batch)
        streams = [engine.add_request(p, bench.greedy(config.new_tokens)) for p in prompts]
        while not all(s.token_ids for s in streams):
            engine.step()
        for _ in range(4):
            engine.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            wall = (time.perf_counter() - start) / steps * 1e3
            torch.cuda.synchronize()
        print(f"batch {batch}: host wall {wall:.3f} ms/step")
        report(_intervals(prof), steps)
        while not all(s.finished for s in streams):
            engine.step()
    for length in config.prefill_lens:
        trace_prefill(engine, length)


if __name__ == "__main__":
    main()
