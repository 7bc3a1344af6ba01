"""Inter-token latency under mixed load: decodes running while new prompts prefill.

A closed loop of ``--clients`` clients drives the engine inline (``engine.step()``): each
client sends a request (a fresh prompt of random token ids, ``--new-tokens`` greedy
tokens, EOS ignored) and, when it ends, the next one; client ``i`` starts at step ``i``,
so arrivals spread out as they do in serving. Every output is stamped when the engine
publishes it (an output listener: one ``step()`` call may apply a decode step in flight
and then run a scheduled one, publishing each): TTFT = first stamp − send, ITL = the gaps
between a request's stamps. The first request of each client is warm-up; the rest are
measured. Besides the latencies each row counts the prompts admitted per admitting step
(``admitted_max``; 1 when every arrival gets its own prefill step).

Each ``--caps`` value sets the scheduler's ``max_prefill_tokens_with_decodes`` (``none``:
no cap, prefill takes the whole ``max_num_batched_tokens``) for one run on the same
engine, so the rows compare in the same run::

    python -m bench.engine.mixed_load --device cuda --random-model llama-8b \\
        --tokenizer PATH --clients 64 --caps none,1024,512,256
    .venv/bin/python -m bench.engine.mixed_load --random-model llama-tiny --clients 8 \\
        --prompt-len 128 --new-tokens 32 --caps none,64      # a CPU smoke run

Prints a table and writes JSON to ``bench/results/engine-mixed.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.engine import cuda as engine_cuda
from bench.engine.report import BenchConfig, machine_facts, write_json
from bench.engine.throughput import build_engine, greedy, random_prompts, warm_up

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "engine-mixed.json"


@dataclass
class Request:
    client: int
    sent: float
    measured: bool
    stamps: list[float] = field(default_factory=list)
    tokens: int = 0


@dataclass(frozen=True)
class MixedRow:
    cap: int | None
    requests: int
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    itl_max_ms: float
    mean_step_ms: float
    steps: int
    admitted_mean: float  # prompts admitted per step that admits any
    admitted_max: int


class PublishClock:
    """An output listener: each published batch of outputs with the time it went out."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[Any]]] = []

    def __call__(self, outputs: list[Any]) -> None:
        self.batches.append((time.perf_counter(), outputs))

    def take(self) -> list[tuple[float, list[Any]]]:
        batches, self.batches = self.batches, []
        return batches


class AdmissionCounter:
    """Wraps ``scheduler.schedule``: how many prompts each step admits (prefill starts)."""

    def __init__(self, scheduler: Any) -> None:
        self.counts: list[int] = []
        self._scheduler = scheduler
        self._schedule = scheduler.schedule
        scheduler.schedule = self._counted

    def _counted(self) -> Any:
        waiting = {id(seq) for seq in self._scheduler.waiting}
        out = self._schedule()
        admitted = sum(1 for chunk in out.chunks if id(chunk.seq) in waiting)
        if admitted:
            self.counts.append(admitted)
        return out

    def take(self) -> list[int]:
        counts, self.counts = self.counts, []
        return counts


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


def run_mixed(
    engine: Any,
    probes: tuple[PublishClock, AdmissionCounter],
    cap: int | None,
    args: argparse.Namespace,
    seed: int,
) -> MixedRow:
    engine.scheduler.config = replace(engine.scheduler.config, max_prefill_tokens_with_decodes=cap)
    clock, admissions = probes
    params = greedy(args.new_tokens)
    sent_per_client = [0] * args.clients
    live: dict[str, Request] = {}
    done: list[Request] = []
    step = 0
    counter = 0

    def send(client: int) -> None:
        nonlocal counter
        prompt = random_prompts(1, args.prompt_len, seed + counter)[0]
        counter += 1
        stream = engine.add_request(prompt, params)
        live[stream.request_id] = Request(client, time.perf_counter(), sent_per_client[client] > 0)
        sent_per_client[client] += 1

    clock.take()
    admissions.take()
    start = time.perf_counter()
    steps_before = engine.stats().num_steps
    measured_start: float | None = None
    while live or step < args.clients:
        if step < args.clients:
            send(step)
        engine.step()
        step += 1
        for stamp, outputs in clock.take():
            for output in outputs:
                request = live.get(output.request_id)
                if request is None:
                    continue
                if output.token_ids:
                    request.stamps.append(stamp)
                    request.tokens += len(output.token_ids)
                if output.finish_reason is not None:
                    done.append(live.pop(output.request_id))
                    if sent_per_client[request.client] < args.requests_per_client:
                        if measured_start is None:
                            measured_start = stamp
                        send(request.client)
    end = time.perf_counter()
    measured = [r for r in done if r.measured]
    ttft = [r.stamps[0] - r.sent for r in measured if r.stamps]
    itl = [b - a for r in measured for a, b in zip(r.stamps, r.stamps[1:], strict=False)]
    window = end - (measured_start or start)
    steps = engine.stats().num_steps - steps_before
    admitted = admissions.take()
    return MixedRow(
        cap=cap,
        requests=len(measured),
        output_tok_s=sum(r.tokens for r in measured) / window,
        ttft_p50_ms=_pct(ttft, 50),
        ttft_p99_ms=_pct(ttft, 99),
        itl_p50_ms=_pct(itl, 50),
        itl_p99_ms=_pct(itl, 99),
        itl_max_ms=max(itl, default=float("nan")) * 1e3,
        mean_step_ms=(end - start) / max(1, steps) * 1e3,
        steps=steps,
        admitted_mean=sum(admitted) / max(1, len(admitted)),
        admitted_max=max(admitted, default=0),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ITL and TTFT under mixed load, per prefill cap")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-model", choices=sorted(engine_cuda.RANDOM_MODELS))
    parser.add_argument("--tokenizer")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=4, help="the first: warm-up")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--caps", default="none,1024,512,256", help="comma-separated; none")
    parser.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def format_rows(rows: list[MixedRow]) -> str:
    lines = [
        f"{'cap':>6}  {'reqs':>5}  {'tok/s':>8}  {'TTFT p50':>8}  {'TTFT p99':>8}  "
        f"{'ITL p50':>7}  {'ITL p99':>7}  {'ITL max':>7}  {'step ms':>7}  {'admitted':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r.cap or 'none':>6}  {r.requests:>5}  {r.output_tok_s:>8.0f}  "
            f"{r.ttft_p50_ms:>8.1f}  {r.ttft_p99_ms:>8.1f}  {r.itl_p50_ms:>7.2f}  "
            f"{r.itl_p99_ms:>7.2f}  {r.itl_max_ms:>7.1f}  {r.mean_step_ms:>7.2f}  "
            f"{r.admitted_mean:>4.2f}/{r.admitted_max:<4}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    caps = [None if c == "none" else int(c) for c in args.caps.split(",")]
    config = BenchConfig(
        batches=(args.clients,),
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        ttft_prompt_len=args.prompt_len,
        ttft_trials=1,
        repeats=1,
        threads=torch.get_num_threads(),
        skip_hf=True,
        device=args.device,
        random_model=args.random_model,
        tokenizer=args.tokenizer,
        max_num_seqs=max(64, args.clients),
        max_batched_tokens=args.max_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        async_scheduling=args.async_scheduling,
    )
    facts = machine_facts()
    if args.device.startswith("cuda"):
        facts.update(engine_cuda.gpu_facts(torch.device(args.device)))
    engine, _ = build_engine(config)
    warm_up(engine, None, args.prompt_len)
    clock = PublishClock()
    engine.add_output_listener(clock)
    probes = (clock, AdmissionCounter(engine.scheduler))
    rows = [
        run_mixed(engine, probes, cap, args, seed=7_000_000 + 100_000 * i)
        for i, cap in enumerate(caps)
    ]
    print(
        f"\nMixed load: {args.clients} clients, {args.prompt_len}-token prompts, "
        f"{args.new_tokens} new tokens, max_num_batched_tokens {args.max_batched_tokens}"
    )
    print(format_rows(rows))
    write_json(
        args.out,
        {
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": facts,
            "model": args.random_model,
            "config": vars(args) | {"out": str(args.out)},
            "rows": [asdict(r) for r in rows],
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
