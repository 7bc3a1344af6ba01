"""The soak's tenant phase (phase 3) and its report: quiet tenants alone, then beside a
noisy one at 10x its concurrency limit (``soak.py``'s docstring says what is measured)."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from typing import Any

import httpx

from bench.common.load import RequestRecord, completion_body, stream_completion
from bench.serving.soak_cluster import MODEL, SoakCluster


def sampled_body(prompt: str, max_tokens: int, temperature: float | None) -> dict[str, Any]:
    """A streaming completion at ``temperature`` (None: the server's default, 1.0)."""
    body = completion_body(MODEL, prompt, max_tokens)
    del body["temperature"]
    if temperature is not None:
        body["temperature"] = temperature
    return body


class TenantPhase:
    """Phase 3: quiet tenants alone, then beside a noisy one at 10x its limit."""

    def __init__(self, cluster: SoakCluster, args: argparse.Namespace, prompts: list[str]):
        self.cluster, self.args, self.prompts = cluster, args, prompts

    async def run(self) -> dict[str, Any]:
        half = self.args.tenant_duration / 2
        limits = httpx.Limits(max_connections=self.args.concurrency * 2 + 64)
        async with httpx.AsyncClient(
            base_url=self.cluster.base_url, limits=limits, timeout=600
        ) as client:
            alone = await self._quiet(client, half)
            stop = asyncio.Event()
            noise = asyncio.create_task(self._noisy(client, stop))
            beside = await self._quiet(client, half)
            stop.set()
            noisy = await noise
        return {
            "duration_s": self.args.tenant_duration,
            "quiet_tenants": self.args.concurrency,
            "tenant_max_concurrent": self.args.tenant_max_concurrent,
            "quiet_alone": quiet_summary(alone),
            "quiet_beside_noise": quiet_summary(beside),
            "noisy_requests": len(noisy),
            "noisy_429": sum(1 for status in noisy if status == 429),
            "noisy_ok": sum(1 for status in noisy if status == 200),
            "noisy_statuses": {str(k): v for k, v in sorted(Counter(noisy).items())},
        }

    async def _quiet(self, client: httpx.AsyncClient, seconds: float) -> list[RequestRecord]:
        deadline = time.monotonic() + seconds
        records: list[RequestRecord] = []

        async def one_tenant(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                body = sampled_body(rng.choice(self.prompts), 16, self.args.temperature)
                record = await stream_completion(client, {**body, "user": f"quiet-{seed}"})
                records.append(record)

        await asyncio.gather(*(one_tenant(seed) for seed in range(self.args.concurrency)))
        return records

    async def _noisy(self, client: httpx.AsyncClient, stop: asyncio.Event) -> list[int]:
        """One tenant keeping 10x its concurrency limit in flight; each answer's status."""
        statuses: list[int] = []
        body = {**sampled_body(self.prompts[0], 64, self.args.temperature), "user": "noisy"}
        body["stream"] = False
        del body["stream_options"]

        async def sender() -> None:
            while not stop.is_set():
                reply = await client.post("/v1/completions", json=body)
                statuses.append(reply.status_code)
                if reply.status_code == 429:
                    await asyncio.sleep(0.05)  # a client that ignores Retry-After, nearly

        await asyncio.gather(*(sender() for _ in range(10 * self.args.tenant_max_concurrent)))
        return statuses


def quiet_summary(records: list[RequestRecord]) -> dict[str, Any]:
    ttfts = sorted(r.ttft_s for r in records if r.ttft_s is not None and r.failure(16) is None)
    failures = Counter(f for r in records if (f := r.failure(16)) is not None)
    failed = sum(failures.values())
    pick = lambda q: round(1000 * ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))], 1)  # noqa: E731
    return {
        "requests": len(records),
        "failed": failed,
        "failures": dict(failures.most_common(5)),
        "ttft_p50_ms": pick(0.5) if ttfts else None,
        "ttft_p99_ms": pick(0.99) if ttfts else None,
    }


def tenant_table(tenants: dict[str, Any]) -> list[str]:
    alone, beside = tenants["quiet_alone"], tenants["quiet_beside_noise"]
    return [
        f"mixed tenants: {tenants['quiet_tenants']} quiet tenants (closed loop, 16 tokens), "
        f"then beside a noisy tenant at 10x its limit of "
        f"{tenants['tenant_max_concurrent']} concurrent",
        "| quiet | requests | failed | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {row['requests']} | {row['failed']} | {num(row['ttft_p50_ms'], 1)} "
            f"| {num(row['ttft_p99_ms'], 1)} |"
            for name, row in (("alone", alone), ("beside noise", beside))
        ),
        f"noisy tenant: {tenants['noisy_requests']} requests, {tenants['noisy_429']} got 429, "
        f"{tenants['noisy_ok']} served; statuses {tenants['noisy_statuses']}",
        *(
            f"quiet {name} failures: {row['failures']}"
            for name, row in (("alone", alone), ("beside noise", beside))
            if row["failures"]
        ),
        f"goal 0 quiet failed: {alone['failed'] + beside['failed'] == 0}",
    ]


def num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"
