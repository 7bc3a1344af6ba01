"""TTFT, ITL and goodput, aggregated against disaggregated at equal actor count, on a mixed
long-prompt/short-prompt workload (part 2 of ``bench/disaggregation/modes.py``).

Each mode gets a fresh local Dask cluster, one worker process (one thread) per engine
actor: ``aggregated`` = N aggregated actors routed KV-aware; ``disaggregated`` = P
prefill actors and N - P decode actors. The control plane is this
process: a ``ServingService`` over the actors, driven through ``route``/``generate``
(the HTTP layer is left out so the client costs no CPU; it is the same in both modes).

Requests arrive as a Poisson process at ``rate`` per second; ``long_fraction`` of them
have ``long_tokens`` prompt tokens, the rest ``short_tokens``; each asks for
``max_tokens`` tokens with EOS ignored. Per request: TTFT (routed → first token) and the
mean inter-token latency after it (and the longest gap, where a prefill stalled the
decode). Goodput: requests per second of the run that met both the TTFT and the mean-ITL
target (DistServe's definition); "no-stall" goodput: the TTFT target and no gap longer
than the stall target.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, LocalCluster

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.request import PreparedRequest
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import Role

MODEL = "m"


def mode_roles(mode: str, actors: int, prefill_actors: int) -> list[str]:
    """The roles of ``actors`` actors: all aggregated, or ``prefill_actors`` prefill and
    the rest decode."""
    if mode == "aggregated":
        return ["aggregated"] * actors
    return ["prefill"] * prefill_actors + ["decode"] * (actors - prefill_actors)


@dataclass(frozen=True)
class Workload:
    requests: int
    rate: float  # arrivals per second
    long_fraction: float
    long_tokens: int
    short_tokens: int
    max_tokens: int
    ttft_target_s: float
    itl_target_s: float
    stall_target_s: float  # the longest gap a smooth stream may have
    seed: int = 0

    def prompts(self) -> list[tuple[float, list[int]]]:
        """(arrival offset in seconds, prompt) per request; the same in every mode."""
        rng = random.Random(self.seed)
        at, result = 0.0, []
        for _ in range(self.requests):
            at += rng.expovariate(self.rate)
            size = self.long_tokens if rng.random() < self.long_fraction else self.short_tokens
            result.append((at, [rng.randrange(100, 40_000) for _ in range(size)]))
        return result


@dataclass
class RequestRecord:
    prompt_tokens: int
    ttft_s: float
    itl_s: float  # mean gap between tokens after the first
    max_gap_s: float  # the longest of those gaps (a prefill that stalled the decode)


@dataclass
class ModeRow:
    scenario: str
    mode: str
    roles: str  # e.g. "1 prefill + 3 decode"
    requests: int
    duration_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    max_gap_p50_ms: float
    goodput_rps: float  # met the TTFT and the mean-ITL target
    goodput_no_stall_rps: float  # met the TTFT target and no gap beyond the stall target
    throughput_rps: float
    met_slo: int
    disagg_counters: dict[str, int] = field(default_factory=dict)


async def run_mode(
    scenario: str,
    mode: str,
    roles: list[str],
    spec: EngineSpec,
    workload: Workload,
    disagg: DisaggOptions,
) -> ModeRow:
    async with (
        LocalCluster(
            n_workers=len(roles),
            threads_per_worker=1,
            processes=True,
            asynchronous=True,
            dashboard_address=None,
        ) as cluster,
        Client(cluster, asynchronous=True, direct_to_workers=True) as client,
    ):
        workers = sorted(cluster.scheduler_info["workers"])
        proxies = [
            await client.submit(
                EngineActor, spec, f"{role}-{i}", actor=True, workers=[w], pure=False
            )
            for i, (role, w) in enumerate(zip(roles, workers, strict=True))
        ]
        service, handles = await _connect(proxies, roles, disagg)
        try:
            await _one(service, [1, 2, 3] * 20, workload.max_tokens)  # warm-up
            start = time.monotonic()
            records = await asyncio.gather(
                *(_arrive(service, at, prompt, workload) for at, prompt in workload.prompts())
            )
            duration = time.monotonic() - start
            await service.disagg.wait_idle()
        finally:
            for handle in handles:
                await handle.close()
            for proxy in proxies:
                await proxy.stop()
    row = _row(scenario, mode, records, duration, workload, dict(service.disagg.counters))
    row.roles = " + ".join(f"{roles.count(r)} {r}" for r in dict.fromkeys(roles))
    return row


async def _connect(
    proxies: list[Any], roles: list[str], disagg: DisaggOptions
) -> tuple[ServingService, list[ActorHandle]]:
    service = ServingService(ServingMetrics(), disagg=disagg)
    handles = []
    for proxy, role in zip(proxies, roles, strict=True):
        info = ActorInfo.from_dict(await proxy.start())
        if role != "aggregated":
            info = info.with_kv_transfer(await proxy.open_kv_transfer(disagg.transport))
        handle = ActorHandle(info.name, role, proxy, info, role=Role(role))
        await handle.connect()
        service.add_actor(MODEL, handle)
        handles.append(handle)
    await service.models[MODEL].routing.wait_synced()
    return service, handles


async def _arrive(
    service: ServingService, at: float, prompt: list[int], workload: Workload
) -> RequestRecord:
    await asyncio.sleep(at)
    return await _one(service, prompt, workload.max_tokens)


async def _one(service: ServingService, prompt: list[int], max_tokens: int) -> RequestRecord:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request_id = f"bench-{random.getrandbits(48):012x}"
    prepared = PreparedRequest(request_id, service.models[MODEL], prompt, params)
    start = time.monotonic()
    admitted = service.admit(prepared)
    arrivals: list[float] = []
    async for outputs in service.generate(admitted):
        now = time.monotonic()
        arrivals += [now] * sum(len(o.token_ids) for o in outputs)
    ttft = arrivals[0] - start
    itl = (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return RequestRecord(len(prompt), ttft, itl, max(gaps, default=0.0))


def _row(
    scenario: str,
    mode: str,
    records: list[RequestRecord],
    duration: float,
    workload: Workload,
    counters: dict[str, int],
) -> ModeRow:
    ttfts = sorted(r.ttft_s for r in records)
    itls = sorted(r.itl_s for r in records)
    met = sum(
        1
        for r in records
        if r.ttft_s <= workload.ttft_target_s and r.itl_s <= workload.itl_target_s
    )
    smooth = sum(
        1
        for r in records
        if r.ttft_s <= workload.ttft_target_s and r.max_gap_s <= workload.stall_target_s
    )
    return ModeRow(
        scenario=scenario,
        mode=mode,
        roles="",
        requests=len(records),
        duration_s=duration,
        ttft_p50_ms=1000 * statistics.median(ttfts),
        ttft_p99_ms=1000 * _p99(ttfts),
        itl_p50_ms=1000 * statistics.median(itls),
        itl_p99_ms=1000 * _p99(itls),
        max_gap_p50_ms=1000 * statistics.median(r.max_gap_s for r in records),
        goodput_rps=met / duration,
        goodput_no_stall_rps=smooth / duration,
        throughput_rps=len(records) / duration,
        met_slo=met,
        disagg_counters=counters,
    )


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
