"""The planner against a fixed deployment sized for the peak, on a rising-then-falling load.

Both runs in one process, one after the other, on the same workload: an in-process Dask
cluster with ``--budget`` workers, mocker actors (``out=mocker``: real scheduler and KV
bookkeeping, simulated model time whose decode step grows with the KV blocks it reads),
the control plane's Starlette app under uvicorn, and the official ``openai`` client
streaming completions. Requests arrive at fixed times whose rate rises linearly from
``--base-rate`` to ``--peak-rate`` over the first half and falls back over the second.

Reported per run: SLA attainment (share of requests whose client-side TTFT and mean ITL
both meet the targets), p90 TTFT/ITL, and actor-seconds (ready actors integrated over the
run). The planner run starts at one replica; the fixed run holds ``--budget`` replicas.

    python -m bench.serving.planner --duration 60 --peak-rate 10 --budget 4
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import openai
import uvicorn
from distributed import LocalCluster

from bench.common.report import write_json
from dynask.actors.models.model_source import resolve_model
from dynask.control_plane.api.app import build_app
from dynask.control_plane.cluster.deployment_admin import DeploymentAdmin
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.planner.decision import PlannerConfig
from dynask.control_plane.planner.loop import PlannerLoop
from dynask.control_plane.serving.latency_window import percentile
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.repository import Repository

MODEL = "bench"
PORT = 8791


@dataclass
class RunResult:
    mode: str
    requests: int
    failed: int
    sla_attainment: float
    ttft_p90_ms: float
    itl_p90_ms: float
    actor_seconds: float
    max_replicas: int


def arrival_times(duration: float, base: float, peak: float) -> list[float]:
    """Deterministic arrivals: one each time the integrated rate crosses an integer."""
    times, acc, t, dt = [], 0.0, 0.0, 0.01
    while t < duration:
        half = duration / 2
        rate = base + (peak - base) * (t / half if t < half else (duration - t) / half)
        acc += rate * dt
        if acc >= 1.0:
            acc -= 1.0
            times.append(t)
        t += dt
    return times


async def one_request(
    client: openai.AsyncOpenAI, seed: int, args: argparse.Namespace
) -> tuple[float, float] | None:
    started = time.monotonic()
    first = last = None
    deltas = 0
    try:
        stream = await client.completions.create(
            model=MODEL,
            prompt=[100 + (seed * 7919 + i) % 30_000 for i in range(args.prompt_tokens)],
            max_tokens=args.max_tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if not chunk.choices or not chunk.choices[0].text:
                continue
            now = time.monotonic()
            if first is None:
                first = now
            else:
                deltas += 1
            last = now
    except openai.APIError:
        return None
    if first is None or last is None:
        return None
    return first - started, (last - first) / deltas if deltas else 0.0


async def run(mode: str, args: argparse.Namespace, folder: Path) -> RunResult:
    config = PlannerConfig(
        ttft_target_ms=args.ttft_target_ms,
        itl_target_ms=args.itl_target_ms,
        max_workers=args.budget,
        interval_s=args.interval,
        window_s=args.window,
    )
    with tempfile.TemporaryDirectory() as tmp:
        repo = Repository(make_engine(f"sqlite:///{tmp}/planner.db"))
        upgrade(repo.engine)
        async with LocalCluster(
            n_workers=args.budget, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster:
            service = ServingService(ServingMetrics())
            runtime = ClusterRuntime(service, [], scheduler_address=cluster.scheduler_address)
            await runtime.start()
            try:
                return await _measure(mode, args, folder, config, repo, runtime)
            finally:
                await runtime.stop()


async def _measure(
    mode: str,
    args: argparse.Namespace,
    folder: Path,
    config: PlannerConfig,
    repo: Repository,
    runtime: ClusterRuntime,
) -> RunResult:
    replicas = 1 if mode == "planner" else args.budget
    engine_args = {
        "speedup_ratio": 1.0,
        "num_kv_blocks": 4096,
        "decode_ms_per_active_block": args.decode_ms_per_block,
    }
    spec = DeploymentSpec(
        name="decode", model=str(folder), engine="mocker", replicas=replicas,
        engine_args=engine_args, served_model_name=MODEL,
    )  # fmt: skip
    await DeploymentAdmin(repo, runtime).create(spec, "bench")
    while len(runtime.service.ready_actors()) < replicas:
        await asyncio.sleep(0.1)
    planner = PlannerLoop(config, runtime, repo) if mode == "planner" else None
    server = uvicorn.Server(
        uvicorn.Config(build_app(runtime.service), port=PORT, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", max_retries=0, timeout=300
    )
    actor_seconds, max_replicas = 0.0, 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal actor_seconds, max_replicas
        while not done.is_set():
            await asyncio.sleep(0.25)
            ready = len(runtime.service.ready_actors())
            actor_seconds += 0.25 * ready
            max_replicas = max(max_replicas, ready)

    sampler = asyncio.create_task(sample())
    if planner is not None:
        planner.start()
    start = time.monotonic()
    tasks = []
    for i, at in enumerate(arrival_times(args.duration, args.base_rate, args.peak_rate)):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        tasks.append(asyncio.create_task(one_request(client, i, args)))
    results = await asyncio.gather(*tasks)
    done.set()
    await sampler
    if planner is not None:
        planner.stop()
    await client.close()
    server.should_exit = True
    await serving
    ok = [r for r in results if r is not None]
    met = sum(
        1
        for ttft, itl in ok
        if ttft * 1000 <= args.ttft_target_ms and itl * 1000 <= args.itl_target_ms
    )
    return RunResult(
        mode=mode,
        requests=len(results),
        failed=len(results) - len(ok),
        sla_attainment=met / len(results) if results else 0.0,
        ttft_p90_ms=1000 * (percentile([t for t, _ in ok], 0.9) or 0.0),
        itl_p90_ms=1000 * (percentile([i for _, i in ok], 0.9) or 0.0),
        actor_seconds=actor_seconds,
        max_replicas=max_replicas,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per run")
    parser.add_argument("--base-rate", type=float, default=1.0, help="requests/s at the ends")
    parser.add_argument("--peak-rate", type=float, default=10.0, help="requests/s mid-run")
    parser.add_argument("--budget", type=int, default=4, help="workers; the fixed run's size")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--decode-ms-per-block", type=float, default=0.5, help="mocker timing")
    parser.add_argument("--ttft-target-ms", type=float, default=500.0)
    parser.add_argument("--itl-target-ms", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=1.0, help="planner interval (s)")
    parser.add_argument("--window", type=float, default=3.0, help="planner window (s)")
    parser.add_argument("--out", default="bench/results/planner.json")
    return parser


def main() -> None:
    args = _parser().parse_args()
    folder = resolve_model(None).folder  # the bundled model's tokenizer; no weights used
    rows = [asyncio.run(run(mode, args, folder)) for mode in ("fixed", "planner")]
    fixed, planned = rows
    print(f"{'mode':8} {'reqs':>5} {'fail':>4} {'SLA':>6} {'TTFT p90':>9} {'ITL p90':>8} "
          f"{'actor-s':>8} {'max':>4}")  # fmt: skip
    for r in rows:
        print(
            f"{r.mode:8} {r.requests:5d} {r.failed:4d} {r.sla_attainment:6.1%} "
            f"{r.ttft_p90_ms:8.0f}ms {r.itl_p90_ms:6.1f}ms {r.actor_seconds:8.1f} "
            f"{r.max_replicas:4d}"
        )
    saving = 1 - planned.actor_seconds / fixed.actor_seconds if fixed.actor_seconds else 0.0
    print(f"planner / fixed actor-seconds: {1 - saving:.2f} ({saving:.0%} fewer)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "runs": [asdict(r) for r in rows], "actor_seconds_saved": saving}
    write_json(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
