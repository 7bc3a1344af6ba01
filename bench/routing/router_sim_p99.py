"""Experiments on what limits TTFT p99 where the working set overflows the caches: each a
change to the router (or to what it hears) tried in ``router_sim``, none in the product.

On 2000:2600 ×3.5 (``router_sim_tail``) the engines step the whole measured window, the
router's count of queued prefill is within a few percent of the truth, and the p99 is
the queue every engine has at the slice's last burst: only fewer uncached tokens can
shorten it. These experiments ask whether a router could get them:

- ``weights``: the cost's ``recompute_weight`` r and ``decode_weight`` d.
- ``survival``: an oracle that credits an actor's overlap only as far as its engine will
  still hold the blocks when the prompt is admitted (held by a running sequence, or
  deeper in the free queue than the prefill queued ahead): what a perfect estimate of
  evictions before admission could buy.
- ``eviction-age``: among candidates within 5% of the lowest cost, the one whose engine
  evicts the blocks freed longest ago (a global LRU over the four caches, approximated).
- ``early-evictions``: engines report a block's eviction when the step that evicts it
  starts, not when it ends (and ``event_delay_ms`` after).
- ``engine-touch`` (an engine change, for scale): an engine keeps a queued prompt's
  cached prefix from being evicted first while it waits.
- ``plain-lru`` (the engines before 2026-12-06): our router over engines that evict
  plain LRU, as Dynamo's mocker does, instead of the pool's segmented LRU.

Each runs at several KV-event delays (``--delays``), because a single run's p99 moves
±8% with a 20 ms change of delay (the dynamics are chaotic): only a change that holds at
every delay is a finding.

    .venv/bin/python -m bench.routing.router_sim_p99 \
        --out bench/results/router_sim_p99_experiments.json

Design decisions:

- The oracles read the simulated engines' insides, which no router can: they bound what
  an estimate could do; they are not candidates for the product.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.routing.router_sim import (
    PRODUCT,
    TRACE,
    Policy,
    Simulation,
    engine_config,
    router_policy,
)
from bench.routing.sim_engine import BlockKey, SimEngine, SimSequence
from bench.routing.trace import load_trace, parse_slice, warm_and_slice
from dynask.actors.backends.mocker_config import MockerConfig
from dynask.control_plane.routing.kv_router import KVRouter, RouterConfig
from dynask.kv.prefix_index import TierOverlap

SLICES = "600:1200,1000:1600,1600:2200,2000:2600,2500:3100,3000:3600,3300:3900"
GOAL_SLICES = "2000:2600,3000:3600,3300:3900"
NEAR_LOWEST = 0.05  # eviction-age: candidates within this share of the lowest cost


class SurvivalOracleSimulation(Simulation):
    """The overlap an actor is credited with is what its engine will hold at admission."""

    def overlaps(self, seq: SimSequence, approximate: bool) -> dict[str, TierOverlap]:
        believed = super().overlaps(seq, approximate)
        out = {}
        for engine, view in zip(self.engines, self.views, strict=True):
            if engine.name in believed:
                queued = sum(view.prefill_blocks.values())
                blocks = _surviving(engine, view.predicted, seq, believed[engine.name], queued)
                if blocks:
                    out[engine.name] = TierOverlap(blocks)
        return out


def _surviving(
    engine: SimEngine,
    predicted: dict[BlockKey, float],
    seq: SimSequence,
    believed: TierOverlap,
    queued_blocks: int,
) -> int:
    eviction_order = itertools.chain(engine.free_cached, engine.free_protected)
    position = {key: i for i, key in enumerate(eviction_order)}
    count = 0
    for key in seq.keys[: believed.total_blocks]:
        pinned = engine.refs.get(key, 0) > 0
        safe = key in position and position[key] >= queued_blocks
        in_flight = key not in engine.refs and key in predicted
        if not (pinned or safe or in_flight):
            break
        count += 1
    return count


class EarlyEvictionSimulation(Simulation):
    """Engines report evictions when the step that makes them starts."""

    def _start_step(self, index: int) -> None:
        engine = self.engines[index]
        end, chunks, stored, removed = engine.step(self.now_ms)
        engine.busy_until = end
        self._push(end, "step_end", index, chunks)
        if removed:
            self._push(self.now_ms + self.event_delay_ms, "kv_events", index, ([], removed))
        if stored:
            self._push(end + self.event_delay_ms, "kv_events", index, (stored, []))
        if self.prefill_progress:
            left = {seq.index: seq.pending_tokens() for seq, _ in chunks if seq.prefilling()}
            if left:
                self._push(end + self.event_delay_ms, "prefill", index, left)


class TouchOnArrivalSimulation(Simulation):
    """Not a router change: an engine that, when a prompt joins its queue, moves the
    prompt's cached prefix to the back of its free queue (evicted last), so the prefix
    the router chose it for outlasts the wait (vLLM's scheduler does not)."""

    def _arrive(self, seq: SimSequence) -> None:
        super()._arrive(seq)
        engine = next(e for e in self.engines if seq in e.waiting or seq in e.running)
        held = engine.cached_prefix_blocks(seq)
        for key in reversed(seq.keys[:held]):  # the prefix's head ends up evicted last
            if key in engine.free_cached:
                engine.free_cached.move_to_end(key)


class PlainLRUSimulation(Simulation):
    """Our router over engines that evict plain LRU (share 0), Dynamo's mocker's cache."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["config"] = engine_config(ours=False)
        super().__init__(*args, **kwargs)


class AgedEngine(SimEngine):
    """A ``SimEngine`` that notes when it freed each cached block."""

    def __init__(self, name: str, config: MockerConfig) -> None:
        super().__init__(name, config)
        self.freed_at: dict[BlockKey, float] = {}
        self._now_ms = 0.0

    def step(
        self, now_ms: float
    ) -> tuple[float, list[tuple[SimSequence, int]], list[BlockKey], list[BlockKey]]:
        self._now_ms = now_ms
        return super().step(now_ms)

    def _free(self, seq: SimSequence) -> None:
        self.freed_at.update((key, self._now_ms) for key in seq.held)
        super()._free(seq)

    def head_age_ms(self, now_ms: float) -> float:
        """How long ago the block it evicts next was freed (infinite while it has blocks
        no prompt can hit)."""
        queue = self.free_cached or self.free_protected  # probation is evicted first
        if self.free_plain or not queue:
            return float("inf") if self.free_plain else 0.0
        return now_ms - self.freed_at.get(next(iter(queue)), 0.0)


class EvictionAgeSimulation(Simulation):
    """A ``Simulation`` of ``AgedEngine``s, for ``eviction_age_policy``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aged = [AgedEngine(engine.name, self.config) for engine in self.engines]
        self.engines = list(self.aged)


def eviction_age_policy() -> Policy:
    router = KVRouter(PRODUCT.router_config("kv"))

    def choose(sim: Simulation, seq: SimSequence) -> int:
        assert isinstance(sim, EvictionAgeSimulation)
        overlaps = sim.overlaps(seq, approximate=False)
        hashes = list(range(len(seq.keys)))
        decision = router.choose(str(seq.index), hashes, sim.candidates(), overlaps)
        costs = [score.cost for score in decision.scores]
        near = [i for i, cost in enumerate(costs) if cost <= min(costs) * (1 + NEAR_LOWEST)]
        return max(near, key=lambda i: (sim.aged[i].head_age_ms(sim.now_ms), -costs[i]))

    return choose


def _weights(recompute: float, decode: float) -> Callable[[], Policy]:
    config = RouterConfig("kv", recompute_weight=recompute, decode_weight=decode, seed=0)
    return lambda: router_policy(config)


def _product() -> Policy:
    return router_policy(PRODUCT.router_config("kv"))


def _dynamo() -> Policy:
    return router_policy(RouterConfig("kv", seed=0))


Experiment = tuple[type[Simulation], Callable[[], Policy]]
EXPERIMENTS: dict[str, Experiment] = {
    "kv": (Simulation, _product),
    "survival": (SurvivalOracleSimulation, _product),
    "eviction-age": (EvictionAgeSimulation, eviction_age_policy),
    "early-evictions": (EarlyEvictionSimulation, _product),
    "engine-touch": (TouchOnArrivalSimulation, _product),
    "plain-lru": (PlainLRUSimulation, _product),
    **{
        f"r{r:g}-d{d:g}": (Simulation, _weights(r, d))
        for r, d in ((2, 0.1), (4, 0.1), (6, 0.1), (10, 0.1), (3, 0), (3, 0.05), (3, 0.3))
    },
}


@functools.cache
def _dynamo_summary(text: str, speedup: float, warm: int) -> dict[str, float]:
    """Dynamo's cost on the slice (as ``router_sim``'s ``kv-dynamo``), once per process."""
    warm_requests, measured = warm_and_slice(load_trace(TRACE), parse_slice(text), warm)
    return Simulation(
        warm_requests + measured,
        speedup,
        4,
        _dynamo(),
        warm=len(warm_requests),
        config=engine_config(ours=False),
        prefill_progress=False,
        predictions_outlive_evictions=True,
    ).run()


def run(
    name: str, slices: list[str], speedups: list[float], delays: list[float], warm: int
) -> list[dict[str, Any]]:
    """One row per slice, speed-up and delay: the experiment's summary and Dynamo's cost's."""
    simulation, policy = EXPERIMENTS[name]
    trace = load_trace(TRACE)
    rows = []
    for text in slices:
        warm_requests, measured = warm_and_slice(trace, parse_slice(text), warm)
        requests = warm_requests + measured
        for speedup in speedups:
            dynamo = _dynamo_summary(text, speedup, warm)
            for delay in delays:
                result = simulation(
                    requests, speedup, 4, policy(), event_delay_ms=delay, warm=len(warm_requests)
                ).run()
                rows.append(
                    {"slice": text, "speedup": speedup, "delay_ms": delay, "experiment": name}
                    | result
                    | {"p99_over_dynamo": result["ttft_p99"] / dynamo["ttft_p99"]}
                    | {"mean_over_dynamo": result["ttft_mean"] / dynamo["ttft_mean"]}
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--slices", default=GOAL_SLICES)
    parser.add_argument("--speedups", default="3,3.5")
    parser.add_argument("--delays", default="10,20,40")
    parser.add_argument("--warm", type=int, default=600)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    slices = args.slices.split(",")
    speedups = [float(s) for s in args.speedups.split(",")]
    delays = [float(d) for d in args.delays.split(",")]
    rows = []
    for name in args.experiments.split(","):
        mine = run(name, slices, speedups, delays, args.warm)
        rows += mine
        for text in slices:
            for speedup in speedups:
                cell = [r for r in mine if (r["slice"], r["speedup"]) == (text, speedup)]
                p99s = [r["ttft_p99"] for r in cell]
                print(
                    f"{name:<16} {text:>10} x{speedup:<4g} over delays "
                    f"{','.join(f'{d:g}' for d in delays)} ms: TTFT mean "
                    f"{statistics.fmean(r['ttft_mean'] for r in cell):6.0f} p99 "
                    f"{statistics.fmean(p99s):6.0f} ({min(p99s):.0f}..{max(p99s):.0f})"
                    f" hit {statistics.fmean(r['hit'] for r in cell):.3f}",
                    flush=True,
                )
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
