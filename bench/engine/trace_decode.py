"""Where a GPU's decode phase loses time outside its kernels (a diagnostic for issue 19).

    python -m bench.engine.trace_decode --random-model llama-8b --tokenizer T \\
        --batches 256 --prompt-len 512 --new-tokens 128 --max-batched-tokens 8192

Runs each batch as ``bench.engine.throughput`` does; once every row has its first token it
records ``STEPS`` engine steps with the torch profiler (GPU activity only: the host is
not slowed by recording) and prints the wall time per step, the GPU's busy time (the
union of its kernels' and copies' intervals), and the longest idle gaps with the kernels on
either side: a gap after the last kernel of a step is the GPU waiting for the host.
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
        if event.device_type.name == "CUDA":
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


if __name__ == "__main__":
    main()
