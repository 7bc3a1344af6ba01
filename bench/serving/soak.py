"""Soak benchmark: many streams at once, then a long mixed load with workers killed.

Two phases on one cluster (``dask scheduler``, ``--replicas`` ``dask worker``
processes without a nanny, ``dynask serve`` with one ``out=echo`` replica per worker;
see ``soak_cluster.py``):

1. **Concurrent streams**: ``--streams`` (default 1,000) streaming requests opened at
   once, each ``--stream-tokens`` tokens long. Reported: requests that completed with
   exactly their tokens, failures by kind, and the control plane's resident memory
   before, at its peak (sampled every 0.25 s) and after.
2. **Mixed load with kills**: ``--concurrency`` closed-loop clients for ``--duration``
   seconds (default 600), each request at the server's default temperature (1.0, as an
   OpenAI client sends it; ``--temperature`` to choose) with 16, 64 or 128 output
   tokens: sampled requests move to another actor like greedy ones. The
   first ``--kill-every`` seconds (default 120) run undisturbed: the baseline. Then every
   ``--kill-every`` seconds the worker with the most requests in flight gets ``kill -9``
   and a replacement worker starts at once. Reported: requests completed and failed
   (goal: 0 failed), requests migrated (``dynask_migrations_total``), TTFT p99 in the
   baseline window and after it (their ratio), and the control plane's memory growth
   from the end of the baseline window to the end (goal: under 10%).
3. **Mixed tenants**: the same closed-loop clients, each its own tenant (the ``user``
   field; the server limits every keyless tenant to ``--tenant-max-concurrent``
   requests at once), for ``--tenant-duration`` seconds: first alone, then beside a
   noisy tenant keeping 10x its concurrency limit in flight. Reported: the quiet
   tenants' TTFT p50 and p99 alone and beside the noise, their failures (goal: 0), and
   how many of the noisy tenant's requests got 429.

Echo engines make the load cheap and known: every request's token count is checked.
(After a migration an echo engine echoes the resumed prompt, so its text differs from
an undisturbed run; exact greedy continuation is tested with the built-in engine in
``tests/control_plane/reliability/test_worker_loss.py``.)

Run from the repository root::

    .venv/bin/python -m bench.serving.soak                           # 1,000 streams, 10 minutes
    .venv/bin/python -m bench.serving.soak --duration 240 --kill-every 60   # a shorter soak

It prints a table and writes JSON to ``bench/results/soak.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common.load import (
    RequestRecord,
    build_prompts,
    completion_body,
    stream_completion,
    summarize,
)
from bench.common.report import code_version, machine_facts, write_json
from bench.serving.soak_cluster import MODEL, SoakCluster
from bench.serving.soak_tenants import TenantPhase, num, sampled_body, tenant_table

REPO = Path(__file__).resolve().parents[2]
MIXED_MAX_TOKENS = (16, 64, 128)
PROMPT_TOKENS = 160  # longer than any max_tokens: an echo request always gets its tokens


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--stream-tokens", type=int, default=32)
    parser.add_argument("--duration", type=float, default=600.0, help="mixed phase, seconds")
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds between kills")
    parser.add_argument("--concurrency", type=int, default=32, help="mixed-phase clients")
    parser.add_argument("--replicas", type=int, default=3, help="workers = echo actors")
    parser.add_argument("--echo-delay", type=float, default=0.01, help="seconds per echo step")
    parser.add_argument("--temperature", type=float, default=None, help="default: the server's")
    parser.add_argument("--tenant-duration", type=float, default=60.0, help="phase 3, seconds")
    parser.add_argument("--tenant-max-concurrent", type=int, default=2)
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the processes' logs and database here (default: a temp dir)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/soak.json")
    return parser.parse_args(argv)


async def _concurrent_streams(cluster: SoakCluster, args: argparse.Namespace) -> dict[str, Any]:
    """Phase 1: ``--streams`` streams at once; memory before, at the peak, after."""
    limits = httpx.Limits(max_connections=args.streams, max_keepalive_connections=args.streams)
    body = {
        **completion_body(MODEL, "", args.stream_tokens),
        "prompt": list(range(1000, 1000 + args.stream_tokens)),  # echoed back, token by token
    }
    before = cluster.serve_rss_mib()
    peak = [before]

    async def sample_memory() -> None:
        while True:
            peak[0] = max(peak[0], cluster.serve_rss_mib())
            await asyncio.sleep(0.25)

    async with httpx.AsyncClient(base_url=cluster.base_url, limits=limits, timeout=600) as client:
        sampler = asyncio.create_task(sample_memory())
        start = time.perf_counter()
        records = await asyncio.gather(
            # Each stream its own tenant: one tenant's concurrency limit would refuse most.
            *(stream_completion(client, {**body, "user": f"s{i}"}) for i in range(args.streams))
        )
        wall = time.perf_counter() - start
        sampler.cancel()
    summary = summarize(wall, list(records), args.stream_tokens)
    return {
        "streams": args.streams,
        "completed": summary.requests_ok,
        "failed": summary.requests_failed,
        "failures": summary.failures,
        "wall_s": round(wall, 2),
        "ttft_p99_ms": summary.ttft_p99_ms,
        "serve_rss_mib": {"before": before, "peak": peak[0], "after": cluster.serve_rss_mib()},
    }


class MixedLoad:
    """Phase 2: closed-loop clients, a worker killed every ``kill_every`` seconds."""

    def __init__(self, cluster: SoakCluster, args: argparse.Namespace, prompts: list[str]):
        self.cluster = cluster
        self.args = args
        self.prompts = prompts
        self.records: list[tuple[float, int, RequestRecord]] = []  # (sent at, max_tokens, what)
        self.kills: list[dict[str, Any]] = []
        self.rss_baseline_end: float | None = None

    async def run(self) -> dict[str, Any]:
        start = time.monotonic()
        deadline = start + self.args.duration
        limits = httpx.Limits(max_connections=self.args.concurrency)
        async with httpx.AsyncClient(
            base_url=self.cluster.base_url, limits=limits, timeout=600
        ) as client:
            killer = asyncio.create_task(self._kill_periodically(start, deadline))
            await asyncio.gather(
                *(self._client(client, seed, deadline) for seed in range(self.args.concurrency))
            )
            killer.cancel()
        return self._report(start, time.monotonic() - start)

    async def _client(self, client: httpx.AsyncClient, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            max_tokens = rng.choice(MIXED_MAX_TOKENS)
            body = sampled_body(rng.choice(self.prompts), max_tokens, self.args.temperature)
            body["user"] = f"client-{seed}"  # its own tenant: one request at a time
            sent = time.monotonic()
            self.records.append((sent, max_tokens, await stream_completion(client, body)))

    async def _kill_periodically(self, start: float, deadline: float) -> None:
        kill_at = start + self.args.kill_every
        while kill_at < deadline:
            await asyncio.sleep(max(0.0, kill_at - time.monotonic()))
            if self.rss_baseline_end is None:
                self.rss_baseline_end = self.cluster.serve_rss_mib()
            engines = await asyncio.to_thread(self.cluster.engines)
            victim = max(engines, key=lambda e: int(e["in_flight"]))
            await asyncio.to_thread(self.cluster.kill_worker, victim["worker"])
            killed_at = time.monotonic()
            noticed_ms = await self._noticed_after_ms(victim["name"], killed_at)
            # On this thread: a worker started from a pool thread would get its parent-death
            # SIGTERM when that thread ends with this phase's event loop (``spawned``).
            replacement = self.cluster.start_worker()
            self.kills.append(
                {
                    "at_s": round(killed_at - start, 1),
                    "actor": victim["name"],
                    "in_flight": victim["in_flight"],
                    "noticed_after_ms": noticed_ms,
                    "replacement_worker": replacement,
                }
            )
            kill_at += self.args.kill_every

    async def _noticed_after_ms(self, actor: str, killed_at: float) -> float | None:
        """How long after the kill ``/health`` stopped listing the actor (polled every
        2 ms; includes the poll's own HTTP round trip)."""
        async with httpx.AsyncClient(base_url=self.cluster.base_url, timeout=30) as client:
            while time.monotonic() - killed_at < 30:
                engines = (await client.get("/health")).json()["engines"]
                if actor not in {e["name"] for e in engines}:
                    return round(1000 * (time.monotonic() - killed_at), 1)
                await asyncio.sleep(0.002)
        return None

    def _report(self, start: float, wall: float) -> dict[str, Any]:
        first_kill = start + self.args.kill_every
        windows: dict[str, list[RequestRecord]] = {"baseline": [], "with_kills": []}
        failed: dict[str, int] = {}
        completed = 0
        for sent, max_tokens, record in self.records:
            failure = record.failure(max_tokens)
            if failure is None:
                completed += 1
                windows["baseline" if sent < first_kill else "with_kills"].append(record)
            else:
                failed[failure] = failed.get(failure, 0) + 1
        p99 = {name: _ttft_p99_ms(records) for name, records in windows.items()}
        end_rss = self.cluster.serve_rss_mib()
        base_rss = self.rss_baseline_end or end_rss
        return {
            "duration_s": round(wall, 1),
            "kill_every_s": self.args.kill_every,
            "requests": len(self.records),
            "completed": completed,
            "failed": sum(failed.values()),
            "failures": failed,
            "migrated": self.cluster.metric("dynask_migrations_total"),
            "migrations_refused": self.cluster.metric("dynask_migrations_refused_total"),
            "kills": self.kills,
            "ttft_p99_ms": p99,
            "ttft_p99_ratio_kills_to_baseline": (
                p99["with_kills"] / p99["baseline"]
                if p99["with_kills"] and p99["baseline"]
                else None
            ),
            "serve_rss_mib": {"baseline_end": base_rss, "end": end_rss},
            "memory_growth_pct": 100.0 * (end_rss - base_rss) / base_rss,
        }


def _ttft_p99_ms(records: list[RequestRecord]) -> float | None:
    ttfts = sorted(r.ttft_s for r in records if r.ttft_s is not None)
    if not ttfts:
        return None
    return 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from dynask.actors.models.model_source import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None).folder)


def _table(
    streams: dict[str, Any] | None,
    mixed: dict[str, Any] | None,
    tenants: dict[str, Any] | None = None,
) -> str:
    lines = []
    if streams is not None:
        rss = streams["serve_rss_mib"]
        lines += [
            f"concurrent streams: {streams['streams']} opened, {streams['completed']} complete, "
            f"{streams['failed']} failed {streams['failures'] or ''} in {streams['wall_s']} s",
            f"  control-plane RSS MiB: before {rss['before']:.0f}, peak {rss['peak']:.0f}, "
            f"after {rss['after']:.0f}",
        ]
    if mixed is not None:
        p99 = mixed["ttft_p99_ms"]
        ratio = mixed["ttft_p99_ratio_kills_to_baseline"]
        rss = mixed["serve_rss_mib"]
        noticed = [k["noticed_after_ms"] for k in mixed["kills"]]
        lines += [
            f"mixed load: {mixed['duration_s']} s, {len(mixed['kills'])} workers killed "
            f"(every {mixed['kill_every_s']:g} s); lost actor noticed after (ms): {noticed}",
            "| requests | completed | failed | migrated | TTFT p99 baseline ms | "
            "TTFT p99 with kills ms | ratio | RSS growth |",
            "|---|---|---|---|---|---|---|---|",
            f"| {mixed['requests']} | {mixed['completed']} | {mixed['failed']} | "
            f"{mixed['migrated']:.0f} | {num(p99['baseline'])} | {num(p99['with_kills'])} | "
            f"{num(ratio, 2)} | {mixed['memory_growth_pct']:.1f}% "
            f"({rss['baseline_end']:.0f} -> {rss['end']:.0f} MiB) |",
        ]
        if mixed["failures"]:
            lines.append(f"failures: {mixed['failures']}")
        lines.append(f"goal 0 failed: {mixed['failed'] == 0}")
        lines.append(f"goal memory growth under 10%: {mixed['memory_growth_pct'] < 10}")
    if tenants is not None:
        lines += tenant_table(tenants)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    load_start = os.getloadavg()
    prompts = build_prompts(_tokenizer(), 256, PROMPT_TOKENS, "soak")
    serve_flags = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "5"]
    serve_flags += ["--tenant-max-concurrent", str(args.tenant_max_concurrent)]
    with tempfile.TemporaryDirectory(prefix="dynask-soak-") as folder, ExitStack() as stack:
        workdir = args.workdir or Path(folder)
        workdir.mkdir(parents=True, exist_ok=True)
        cluster = SoakCluster(Path(sys.executable).parent, workdir, stack)
        cluster.start(args.replicas, args.echo_delay, serve_flags)
        streams = asyncio.run(_concurrent_streams(cluster, args)) if args.streams else None
        mixed = asyncio.run(MixedLoad(cluster, args, prompts).run()) if args.duration else None
        tenants = (
            asyncio.run(TenantPhase(cluster, args, prompts).run()) if args.tenant_duration else None
        )
    print(_table(streams, mixed, tenants))
    document = {
        "benchmark": "soak",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "bench/serving/soak.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "concurrent_streams": streams,
        "mixed": mixed,
        "tenants": tenants,
        "code": code_version(REPO),
        "machine": machine_facts(load_start),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
