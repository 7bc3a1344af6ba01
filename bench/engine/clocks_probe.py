"""Does a compute-bound phase run at the clock the roofline's matmul rate was measured at?

A diagnostic for issue 19 (decode at batch 256 and the 8k prefill, both compute-bound),
not a benchmark. The roofline divides FLOPs by ``bench.engine.cuda.matmul_rate``: 13
8,192³ products, ~20 ms of work, timed one at a time. This probe builds the random
Llama-3.1-8B-shaped engine of ``bench.engine.throughput`` and, under ``gpu_clocks.ClockLog``
(``nvidia-smi`` sampling the SM clock, power and clock-event reasons), runs in turn:

1. idle, then the roofline's matmul rate as the benchmark measures it (burst);
2. the same products back to back for ``--sustain-s`` seconds, timed in windows: the
   rate a phase of that length gets;
3. fresh prompts of each ``--prefill-lens`` (one token), as ``measure_prefill`` times them;
4. a decode phase at each ``--batches`` (``run_ours``: its step time);
5. the burst rate again.

It prints the rates, the prefill's share of each rate and the clocks per phase, and writes
JSON (``--out``).

    python3 -m bench.engine.clocks_probe --device cuda --random-model llama-8b \\
        --tokenizer TOK --prefill-lens 8192 --max-batched-tokens 8192 --batches 256 \\
        --prompt-len 512 --new-tokens 128 --skip-hf --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial

import torch

from bench.engine import cuda as engine_cuda
from bench.engine import throughput as bench
from bench.engine.args import parse_args
from bench.engine.gpu_clocks import ClockLog, clock_table
from bench.engine.report import machine_facts


def sustained_rates(
    device: torch.device, seconds: float, burst_rate: float, n: int = 8192
) -> list[float]:
    """FLOP/s of back-to-back n³ products in windows of ~0.2 s (at ``burst_rate``) over
    ``seconds``."""
    a = torch.randn((n, n), dtype=torch.bfloat16, device=device)
    b = torch.randn((n, n), dtype=torch.bfloat16, device=device)
    flops = 2 * n**3
    per_window = max(1, int(0.2 * burst_rate / flops))

    window = partial(_products, a, b, per_window)
    rates = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        rates.append(per_window * flops / engine_cuda.timed_seconds(device, window))
    del a, b, window
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rates


def _products(a: torch.Tensor, b: torch.Tensor, count: int) -> None:
    for _ in range(count):
        torch.matmul(a, b)


def _probe_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The probe's own flags; the rest are ``bench.engine.args``'s."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--sustain-s", type=float, default=3.0, help="back-to-back products")
    parser.add_argument("--matmul-n", type=int, default=8192, help="smaller for a CPU's run")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    own, rest = _probe_args(sys.argv[1:] if argv is None else argv)
    sustain_s, matmul_n = own.sustain_s, own.matmul_n
    config, out = parse_args(rest)
    engine, _ = bench.build_engine(config)
    device = torch.device(config.device)
    bench.warm_up(engine, None, prompt_len=config.prompt_len)
    shape = bench.engine_shape(engine)
    facts = engine_cuda.gpu_facts(device) if device.type == "cuda" else machine_facts()
    result: dict[str, object] = {"machine": facts}
    clock_log = ClockLog(out.with_suffix(".smi.csv"))
    with clock_log as log:
        log.mark("idle")
        time.sleep(1.0)
        log.mark("matmul burst (roofline's)")
        burst = engine_cuda.matmul_rate(device, matmul_n)
        log.mark(f"matmul sustained {sustain_s:g} s")
        windows = sustained_rates(device, sustain_s, burst, matmul_n)
        prefill = []
        for length in config.prefill_lens:
            log.mark(f"prefill {length}")
            prefill += engine_cuda.measure_prefill(
                engine, (length,), lambda n, i: bench.random_prompts(1, n, 900 + i)[0],
                bench.greedy(1),
            )  # fmt: skip
        decode = {}
        for batch in config.batches:
            prompts = bench.random_prompts(batch, config.prompt_len, 77 + batch)
            log.mark(f"decode batch {batch}")
            run = bench.run_ours(engine, prompts, config.new_tokens)
            decode[batch] = run.decode_step_ms
        log.mark("matmul burst again")
        burst_after = engine_cuda.matmul_rate(device, matmul_n)
    settled = statistics.median(windows[len(windows) // 2 :])
    engine_cuda.add_matmul_shares(prefill, shape, burst)  # model_tflop_s, of_matmul_rate
    prefill_rows = {
        str(row["prompt_len"]): {
            "seconds": row["seconds"],
            "model_tflop_s": row["model_tflop_s"],
            "of_burst_rate": row["of_matmul_rate"],
            "of_sustained_rate": row["model_tflop_s"] * 1e12 / settled,
        }
        for row in prefill
    }
    clocks = clock_log.summary()
    result.update(
        burst_tflop_s=burst / 1e12,
        burst_after_tflop_s=burst_after / 1e12,
        sustained_window_tflop_s=[r / 1e12 for r in windows],
        sustained_settled_tflop_s=settled / 1e12,
        prefill=prefill_rows,
        decode_step_ms={str(b): ms for b, ms in decode.items()},
        clocks=clocks,
    )
    print(f"bf16 matmul: burst {burst / 1e12:.0f} TFLOP/s (again at the end "
          f"{burst_after / 1e12:.0f}); back to back for {sustain_s:g} s, windows "
          + " ".join(f"{r / 1e12:.0f}" for r in windows)
          + f"; settled (median of the second half) {settled / 1e12:.0f}")  # fmt: skip
    for label, row in prefill_rows.items():
        print(f"prefill {label}: {row['seconds'] * 1e3:.1f} ms, {row['model_tflop_s']:.0f} "
              f"TFLOP/s = {row['of_burst_rate']:.1%} of the burst rate, "
              f"{row['of_sustained_rate']:.1%} of the sustained one")  # fmt: skip
    for batch, ms in decode.items():
        print(f"decode batch {batch}: step {ms:.2f} ms" if ms else f"decode batch {batch}: -")
    print(clock_table(clocks))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
