"""Benchmark of the serving path: dynask's control plane under closed-loop streaming load.

What it measures: N concurrent clients, each sending a streaming ``/v1/completions``
request (a distinct ~200-token text prompt, 64 output tokens, EOS ignored), reading the
SSE stream to its end, then sending the next. Per scenario: requests/s, output tokens/s,
TTFT and ITL p50/p99 measured client-side from SSE chunk arrival, and CPU milliseconds
per request of the control plane (``dynask serve``, its own process: utime + stime
from ``/proc/PID/stat`` over the measured window, divided by requests completed). The
engine's process group (the dask worker) and this client are charged the same way.

Scenarios, each on a fresh cluster (``dask scheduler``, one ``dask worker``, ``dynask
serve``, in separate processes; see ``serve_cluster.py``):

* ``mocker``: ``out=mocker`` with ``speedup_ratio: 0`` (no simulated model time), so
  the control plane's own ceiling shows, at 1, 16 and 64 clients.
* ``torch``: the built-in engine with the bundled SmolLM2-135M-Instruct at 1 and 8
  clients. The engine's own TTFT is measured in this process too (``LLMEngine``, same
  prompt length, ``max_tokens=1``), so the control plane's TTFT overhead is
  HTTP TTFT p50 at 1 client minus the engine's TTFT p50.
* ``vllm`` (only when named in ``--scenarios``): ``out=vllm``, vLLM's CPU build with
  the same model, at the torch engine's concurrencies and request counts.
* ``--with-dynamo``: the mocker load against NVIDIA Dynamo's frontend + mocker (the peer
  install in ``../shared/peers/dynamo``), CPU charged to its frontend process. If it
  cannot be installed or started, the reason is printed and the run goes on.

Every scenario sends warm-up requests at its concurrency before the measured window.
Goals from the issue: at 64 streams at most 2 ms of control-plane CPU per request
(mocker); at 1 client TTFT p50 at most 10 ms above the engine's own (torch).

Run it from the repository root::

    .venv/bin/python -m bench.serving.serve                      # full run, a few minutes
    .venv/bin/python -m bench.serving.serve --quick              # smoke run, small counts
    .venv/bin/python -m bench.serving.serve --scenarios mocker --requests 2000 --with-dynamo

It prints a table and writes JSON to ``bench/results/serve.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common.load import LoadSpec, build_prompts, new_client, run_load, summarize
from bench.common.paths import shared_path
from bench.common.processes import (
    DynamoInstall,
    ServingTarget,
    cpu_seconds,
    dynamo_stack,
    dynask_stack,
    group_cpu_seconds,
)
from bench.common.report import code_version, machine_facts, write_json
from bench.serving.report import (
    EngineTTFT,
    Row,
    evaluate_goals,
    format_row,
    format_table,
    ttft_overhead_ms,
)

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
DEFAULT_OUT = REPO / "bench" / "results" / "serve.json"
DYNAMO_SCRIPTS = shared_path("peers", "dynamo")
DYNAMO_SETUP_TIMEOUT_S = 900.0
SCENARIOS = ("mocker", "torch", "vllm")
MOCKER_ARGS = {"speedup_ratio": 0}  # no simulated model time: the control plane's ceiling
TORCH_ARGS: dict[str, Any] = {"kv_cache_gib": 1}
VLLM_ARGS = {"kv_cache_gib": 1}  # out=vllm: vLLM's CPU build, float32, eager
IDLE_WINDOW_S = 3.0
ENGINE_THREADS = 1  # the worker runs with --nthreads 1, and its engine gives torch as many


@dataclass(frozen=True)
class BenchConfig:
    scenarios: tuple[str, ...]
    mocker_concurrency: tuple[int, ...]
    torch_concurrency: tuple[int, ...]
    mocker_requests: int  # measured requests per concurrency level
    torch_requests: int
    prompt_tokens: int
    max_tokens: int
    engine_ttft_trials: int
    with_dynamo: bool
    ready_timeout_s: float
    request_timeout_s: float


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far of the control plane, the engine's processes and this client."""

    frontend_s: float
    engine_s: float
    client_s: float

    @classmethod
    def take(cls, target: ServingTarget) -> CpuSample:
        own = os.times()
        return cls(
            cpu_seconds(target.frontend_pid),
            group_cpu_seconds(target.engine_pgid),
            own.user + own.system,
        )


def warmup_count(engine: str, concurrency: int) -> int:
    """Enough to open every connection and fill the batch; fewer for the slow torch engine."""
    return max(concurrency, 2) if engine != "mocker" else max(2 * concurrency, 10)


async def measure(
    target: ServingTarget, engine: str, concurrency: int, config: BenchConfig, prompts: list[str]
) -> Row:
    """Warm-up requests, then the measured window with CPU read just before and after."""
    spec = LoadSpec(concurrency, config.max_tokens, config.request_timeout_s)
    warm = warmup_count(engine, concurrency)
    async with new_client(spec, target.base_url) as client:
        await run_load(client, spec, target.model, prompts[:warm])
        before = CpuSample.take(target)
        wall_s, records = await run_load(client, spec, target.model, prompts[warm:])
        after = CpuSample.take(target)
    load = summarize(wall_s, records, config.max_tokens)

    def per_request(start: float, end: float) -> float | None:
        return (end - start) * 1000 / load.requests_ok if load.requests_ok else None

    return Row(
        system=target.system,
        engine=engine,
        concurrency=concurrency,
        load=load,
        cp_cpu_ms_per_req=per_request(before.frontend_s, after.frontend_s),
        engine_cpu_ms_per_req=per_request(before.engine_s, after.engine_s),
        client_cpu_ms_per_req=per_request(before.client_s, after.client_s),
        load_avg_1m=os.getloadavg()[0],
    )


def idle_cpu_ms_per_s(target: ServingTarget) -> float:
    """The control plane's CPU use with no requests (stats polling, heartbeats)."""
    before = cpu_seconds(target.frontend_pid)
    time.sleep(IDLE_WINDOW_S)
    return (cpu_seconds(target.frontend_pid) - before) * 1000 / IDLE_WINDOW_S


def measure_engine_ttft(tokenizer: Any, config: BenchConfig) -> EngineTTFT:
    """Median time from ``add_request`` until a step hands out the first token.

    Torch gets the thread count the worker's engine has (``--nthreads 1``), so both
    engines compute alike; this process's own setting is restored afterwards.
    """
    import torch

    from dynask.actors.api.sampling_params import SamplingParams
    from dynask.actors.engine.config import EngineConfig
    from dynask.actors.engine.engine import LLMEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(ENGINE_THREADS)
    try:
        engine = LLMEngine(EngineConfig(**TORCH_ARGS))
        prompts = build_prompts(
            tokenizer, config.engine_ttft_trials + 2, config.prompt_tokens, "engine-ttft"
        )
        prompt_ids = [[int(t) for t in tokenizer.encode(p)] for p in prompts]
        times_ms = []
        for ids in prompt_ids:  # the first two warm up
            start = time.perf_counter()
            stream = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0))
            while not any(o.request_id == stream.request_id and o.token_ids for o in engine.step()):
                pass
            times_ms.append((time.perf_counter() - start) * 1000)
            while not stream.finished:
                engine.step()
    finally:
        torch.set_num_threads(threads)
    measured = times_ms[2:]
    prompt_tokens = round(statistics.mean(len(ids) for ids in prompt_ids))
    return EngineTTFT(
        prompt_tokens, ENGINE_THREADS, len(measured), statistics.median(measured), measured
    )


@dataclass
class BenchRun:
    """The scenarios of one run, sharing the config, the tokenizer and a scratch folder."""

    config: BenchConfig
    tokenizer: Any
    workdir: Path
    rows: list[Row] = field(default_factory=list)
    idle_cpu_ms_per_s: dict[str, float] = field(default_factory=dict)
    engine_ttft: EngineTTFT | None = None
    dynamo_skipped: str | None = None
    code: dict[str, Any] = field(default_factory=dict)  # as it was when the stacks started

    def level(self, target: ServingTarget, engine: str, concurrency: int) -> None:
        """One measured window at one concurrency, with prompts of its own."""
        requests = self.config.torch_requests if engine != "mocker" else self.config.mocker_requests
        tag = f"{target.system}-{engine}-c{concurrency}"
        count = warmup_count(engine, concurrency) + requests
        prompts = build_prompts(self.tokenizer, count, self.config.prompt_tokens, tag)
        _say(f"  {tag}: {requests} requests ...")
        row = asyncio.run(measure(target, engine, concurrency, self.config, prompts))
        _say("  " + format_row(row))
        self.rows.append(row)

    @contextmanager
    def started(
        self, label: str, stack: AbstractContextManager[ServingTarget]
    ) -> Iterator[ServingTarget]:
        """Enters ``stack`` and records its control plane's idle CPU use first."""
        _say(f"{label}: starting ...")
        with stack as target:
            self.idle_cpu_ms_per_s[label] = idle_cpu_ms_per_s(target)
            yield target

    def mocker(self) -> None:
        stack = dynask_stack(
            VENV_BIN, "mocker", MOCKER_ARGS, self.workdir / "mocker", self.config.ready_timeout_s
        )
        with self.started("dynask-mocker", stack) as target:
            for concurrency in self.config.mocker_concurrency:
                self.level(target, "mocker", concurrency)

    def torch(self) -> None:
        """The HTTP rows; the engine's own TTFT right after 1 client, on the idle cluster."""
        stack = dynask_stack(
            VENV_BIN, "torch", TORCH_ARGS, self.workdir / "torch", self.config.ready_timeout_s
        )
        with self.started("dynask-torch", stack) as target:
            for concurrency in self.config.torch_concurrency:
                self.level(target, "torch", concurrency)
                if concurrency == 1:
                    _say("  engine TTFT in-process ...")
                    self.engine_ttft = measure_engine_ttft(self.tokenizer, self.config)
                    _say(f"\n  engine TTFT p50 {self.engine_ttft.p50_ms:.1f} ms")

    def vllm(self) -> None:
        """``out=vllm`` through the same stack, at the torch engine's concurrencies."""
        stack = dynask_stack(
            VENV_BIN, "vllm", VLLM_ARGS, self.workdir / "vllm", self.config.ready_timeout_s
        )
        with self.started("dynask-vllm", stack) as target:
            for concurrency in self.config.torch_concurrency:
                self.level(target, "vllm", concurrency)

    def dynamo(self) -> None:
        """The mocker load against Dynamo; on failure, says why and records it."""
        home = Path(os.environ.get("PEER_DYNAMO_DIR", Path.home() / ".peer_dynamo"))
        install = DynamoInstall(DYNAMO_SCRIPTS, home)
        try:
            if not install.is_set_up():
                _say("dynamo: running dynamo.sh setup ...")
                install.set_up(self.workdir / "dynamo-setup.log", DYNAMO_SETUP_TIMEOUT_S)
            stack = dynamo_stack(install, self.workdir / "dynamo", self.config.ready_timeout_s)
            with self.started("dynamo-mocker", stack) as target:
                for concurrency in self.config.mocker_concurrency:
                    self.level(target, "mocker", concurrency)
        except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
            self.dynamo_skipped = f"{type(exc).__name__}: {exc}"
            _say(f"dynamo: skipped: {self.dynamo_skipped}")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_tokenizer() -> Any:
    """The bundled SmolLM2 tokenizer, which the mocker and the torch engine both use."""
    from transformers import AutoTokenizer

    from dynask.actors.models.model_source import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None).folder)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> tuple[BenchConfig, Path]:
    parser = argparse.ArgumentParser(description="Closed-loop streaming load on dynask serve.")
    parser.add_argument("--quick", action="store_true", help="smoke run: small counts")
    parser.add_argument("--scenarios", default="mocker,torch", help="mocker,torch,vllm")
    parser.add_argument("--requests", type=positive_int, help="measured mocker requests per level")
    parser.add_argument("--torch-requests", type=positive_int, help="measured torch requests")
    parser.add_argument("--prompt-tokens", type=positive_int, default=200)
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("--with-dynamo", action="store_true", help="also load NVIDIA Dynamo")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown or not scenarios:
        parser.error(f"--scenarios has {args.scenarios!r}; choose from {', '.join(SCENARIOS)}")
    config = BenchConfig(
        scenarios=scenarios,
        mocker_concurrency=(1, 16, 64),
        torch_concurrency=(1, 8),
        mocker_requests=args.requests or (100 if args.quick else 1000),
        torch_requests=args.torch_requests or (4 if args.quick else 16),
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        engine_ttft_trials=3 if args.quick else 10,
        with_dynamo=args.with_dynamo,
        ready_timeout_s=300.0,
        request_timeout_s=120.0,
    )
    return config, args.out


def run_scenarios(config: BenchConfig, workdir: Path) -> BenchRun:
    run = BenchRun(config, load_tokenizer(), workdir, code=code_version(REPO))
    if "mocker" in config.scenarios:
        run.mocker()
        if config.with_dynamo:
            run.dynamo()
    if "torch" in config.scenarios:
        run.torch()
    if "vllm" in config.scenarios:
        run.vllm()
    return run


def report(run: BenchRun, out: Path, load_start: tuple[float, float, float]) -> None:
    config = run.config
    goals = evaluate_goals(run.rows, run.engine_ttft)
    print(
        format_table(
            run.rows,
            run.engine_ttft,
            goals,
            run.idle_cpu_ms_per_s,
            config.prompt_tokens,
            config.max_tokens,
        )
    )
    if run.dynamo_skipped:
        print(f"dynamo skipped: {run.dynamo_skipped}")
    document = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "code_at_start": run.code,
        "code_at_end": code_version(REPO),  # differs if the tree changed during the run
        "machine": machine_facts(load_start),
        "config": asdict(config),
        "rows": [asdict(r) for r in run.rows],
        "engine_ttft": asdict(run.engine_ttft) if run.engine_ttft else None,
        "ttft_overhead_ms": ttft_overhead_ms(run.rows, run.engine_ttft),
        "control_plane_idle_cpu_ms_per_s": run.idle_cpu_ms_per_s,
        "dynamo_skipped": run.dynamo_skipped,
        "goals": goals,
    }
    write_json(out, document)
    print(f"wrote {out}")


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the stacks, which stop their processes


def main(argv: list[str] | None = None) -> int:
    config, out = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dynask-bench-serve-") as tmp:
        run = run_scenarios(config, Path(tmp))
    report(run, out, load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
