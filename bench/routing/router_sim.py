"""An offline, deterministic simulator of trace replay: routing policies compared in seconds.

``trace_replay`` measures real processes (minutes a run, ~10% noise a run, and only on a
quiet machine). This module replays the same slice of the Mooncake trace against N
simulated engines in simulated time, so routing policies can be compared on many slices
and speed-ups at once, and the routing decision itself is the real one: each arrival
builds ``Candidate``s and overlaps the way ``ModelRouting`` does and asks a ``KVRouter``.

Design decisions:

- The engine is the mocker's scheduler in miniature (``sim_engine.SimEngine``, at
  ``trace_systems.matched_timing``: chunked prefill of 8,192 tokens a step, first come
  first served, prefix caching of 64-token blocks), a step lasting the mocker's own
  ``simulated_step_ms``. Host time is not modelled.
- The router sees what the control plane sees: its own accounting of the load
  (``ActorLoad``: a request is prefilling its uncached blocks until its first token,
  then decoding all its blocks) and the engines' caches through KV events (blocks
  stored and evicted) that arrive ``event_delay_ms`` after their step; in mode ``kv``
  a routed prompt's blocks count as held by its actor for the product's
  ``--router-predicted-ttl-secs`` (the predicted blocks), or until an event says the
  actor evicted them (``predictions_outlive_evictions=True``: the whole TTL, as before
  2026-12-05).
  ``approximate`` reads only where prompts were routed: the product's ``ApproxIndex`` on
  the simulated clock, pruned at the engine's cache size and protected share as the
  control plane models an engine from its info (``approximate-ttl``: the TTL alone, as
  the product did before 2026-12-06). After a step that advanced a
  prompt's prefill without finishing it the engine reports what is left of it (the
  ``"prefill"`` frames, ``ActorLoad.progress``), ``event_delay_ms`` later too
  (``prefill_progress=False``, ``--no-prefill-progress``: counted whole until the first
  token, as before).
- Deterministic: ties are broken by the router's seeded random, nothing else is random.

    .venv/bin/python -m bench.routing.router_sim --slices 3000:3150,3300:3450 --speedups 2,3,4
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.paths import shared_path
from bench.routing.sim_engine import BlockKey, SimEngine, SimSequence, block_keys
from bench.routing.trace import (
    TraceRequest,
    load_trace,
    parse_slice,
    reusable_token_share,
    warm_and_slice,
)
from bench.routing.trace_systems import matched_timing
from dynask.actors.backends.mocker_config import MockerConfig
from dynask.control_plane.routing.kv_router import Candidate, KVRouter, RouterConfig
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.kv.approx_index import ApproxIndex
from dynask.kv.prefix_index import TierOverlap

TRACE = shared_path("traces", "mooncake_synthetic_trace.jsonl")


@dataclass
class RouterView:
    """What the control plane knows of one actor (``ActorLoad`` + the indices)."""

    prefill_blocks: dict[int, int] = field(default_factory=dict)  # request -> uncached blocks
    decode_blocks: dict[int, int] = field(default_factory=dict)  # request -> held blocks
    known: set[BlockKey] = field(default_factory=set)  # from KV events
    predicted: dict[BlockKey, float] = field(default_factory=dict)  # routed: until (ms)
    approx: ApproxIndex | None = None  # approximate mode's notes (the product's index)

    def overlap(self, keys: Sequence[BlockKey], now_ms: float = 0.0) -> int:
        """Leading blocks of ``keys`` held by the events and the predicted blocks (``kv``)."""
        count = 0
        for key in keys:
            if not (key in self.known or self.predicted.get(key, -1.0) >= now_ms):
                break
            count += 1
        return count


Policy = Callable[["Simulation", SimSequence], int]


class Simulation:
    """One slice, one policy, N engines; ``run`` returns the replay's summary."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        speedup: float,
        actors: int,
        policy: Policy,
        event_delay_ms: float = 20.0,
        engine_order: str = "fcfs",
        warm: int = 0,
        config: MockerConfig | None = None,
        prefill_progress: bool = True,
        predictions_outlive_evictions: bool = False,
        approx_cache: str = "engine",
    ) -> None:
        self.config = config or MockerConfig(**matched_timing(64))
        self.engines = [SimEngine(f"actor-{i}", self.config, engine_order) for i in range(actors)]
        self.views = [
            RouterView(approx=self._approx_index(e.name, approx_cache)) for e in self.engines
        ]
        self._key_ids: dict[BlockKey, int] = {}
        self.policy = policy
        self.event_delay_ms = event_delay_ms
        start = requests[0].timestamp_ms
        self.sequences = [
            SimSequence(
                i,
                (r.timestamp_ms - start) / speedup,
                r.input_length,
                r.output_length,
                block_keys(r, self.config.block_size),
            )
            for i, r in enumerate(requests)
        ]
        self.requests = list(requests)
        self.warm = warm  # the first ``warm`` requests run but are not measured
        self.prefill_progress = prefill_progress
        self.predicted_ttl_ms = PRODUCT.predicted_ttl_s * 1000
        self.predictions_outlive_evictions = predictions_outlive_evictions
        self.now_ms = 0.0
        self._events: list[tuple[float, int, str, int, object]] = []
        self._order = 0

    def _push(self, at: float, kind: str, engine: int, payload: object) -> None:
        self._order += 1
        heapq.heappush(self._events, (at, self._order, kind, engine, payload))

    def run(self) -> dict[str, float]:
        for seq in self.sequences:
            self._push(seq.arrival_ms, "arrive", -1, seq)
        while self._events:
            at, _, kind, engine, payload = heapq.heappop(self._events)
            self.now_ms = at
            if kind == "arrive":
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == "step_end":
                self._step_end(engine, payload)  # type: ignore[arg-type]
            elif kind == "kv_events":
                self._kv_events(engine, *payload)  # type: ignore[misc]
            elif kind == "prefill":
                self._prefill_reported(engine, payload)  # type: ignore[arg-type]
        return self.summary()

    def _prefill_reported(self, engine: int, progress: dict[int, int]) -> None:
        prefill_blocks = self.views[engine].prefill_blocks
        for index, pending in progress.items():
            if index in prefill_blocks:
                prefill_blocks[index] = -(-pending // self.config.block_size)

    def _kv_events(self, engine: int, stored: list[BlockKey], removed: list[BlockKey]) -> None:
        view = self.views[engine]
        view.known.difference_update(removed)
        view.known.update(stored)
        if not self.predictions_outlive_evictions:
            for key in removed:
                view.predicted.pop(key, None)

    def _arrive(self, seq: SimSequence) -> None:
        choice = self.policy(self, seq)
        engine, view = self.engines[choice], self.views[choice]
        overlap = view.overlap(seq.keys, now_ms=self.now_ms)
        uncached_tokens = seq.prompt_tokens - overlap * self.config.block_size
        view.prefill_blocks[seq.index] = -(-uncached_tokens // self.config.block_size)
        until = self.now_ms + self.predicted_ttl_ms
        view.predicted.update((key, until) for key in seq.keys)
        assert view.approx is not None
        view.approx.note_routed(engine.name, self.local_hashes(seq))
        engine.waiting.append(seq)
        if engine.busy_until is None:
            self._start_step(choice)

    def _start_step(self, index: int) -> None:
        engine = self.engines[index]
        end, chunks, stored, removed = engine.step(self.now_ms)
        engine.busy_until = end
        self._push(end, "step_end", index, chunks)
        if stored or removed:
            self._push(end + self.event_delay_ms, "kv_events", index, (stored, removed))
        if self.prefill_progress:
            left = {seq.index: seq.pending_tokens() for seq, _ in chunks if seq.prefilling()}
            if left:
                self._push(end + self.event_delay_ms, "prefill", index, left)

    def _step_end(self, index: int, chunks: list[tuple[SimSequence, int]]) -> None:
        engine, view = self.engines[index], self.views[index]
        for seq, _ in chunks:
            blocks = -(-(seq.prompt_tokens + seq.generated) // self.config.block_size)
            if seq.generated >= seq.output_tokens:
                view.prefill_blocks.pop(seq.index, None)
                view.decode_blocks.pop(seq.index, None)
            elif seq.first_token_ms is not None:
                view.prefill_blocks.pop(seq.index, None)
                view.decode_blocks[seq.index] = blocks
        engine.busy_until = None
        if engine.waiting or engine.running:
            self._start_step(index)

    def candidates(self) -> list[Candidate]:
        return [
            Candidate(
                e.name,
                active_prefill_blocks=sum(v.prefill_blocks.values()),
                active_decode_blocks=sum(v.decode_blocks.values()),
                cached_blocks=len(v.known),
                queue_length=len(v.prefill_blocks),
            )
            for e, v in zip(self.engines, self.views, strict=True)
        ]

    def overlaps(self, seq: SimSequence, approximate: bool) -> dict[str, TierOverlap]:
        out = {}
        hashes = self.local_hashes(seq) if approximate else []
        for engine, view in zip(self.engines, self.views, strict=True):
            if approximate:
                assert view.approx is not None
                blocks = view.approx.find_matches(hashes).get(engine.name, 0)
            else:
                blocks = view.overlap(seq.keys, self.now_ms)
            if blocks:
                out[engine.name] = TierOverlap(blocks)
        return out

    def local_hashes(self, seq: SimSequence) -> list[int]:
        """The sequence's block keys as the ints an ``ApproxIndex`` takes (one per key)."""
        ids = self._key_ids
        return [ids.setdefault(key, len(ids)) for key in seq.keys]

    def _approx_index(self, name: str, approx_cache: str) -> ApproxIndex:
        """Mode approximate's index on the simulated clock: ``engine`` models the engine's
        cache as the control plane does from its info (size, protected share), ``ttl``
        keeps every routed block for the TTL (the product before 2026-12-06)."""
        if approx_cache not in ("engine", "ttl"):
            raise ValueError(f"approx_cache has value {approx_cache!r}; expected engine or ttl")
        index = ApproxIndex(PRODUCT.approx_ttl_s, clock=lambda: self.now_ms / 1000)
        if approx_cache == "engine":
            share = self.config.prefix_cache_protected_share
            index.set_actor_cache(name, self.config.num_kv_blocks, share)
        return index

    def summary(self) -> dict[str, float]:
        measured = self.sequences[self.warm :]
        ttfts = sorted(s.first_token_ms - s.arrival_ms for s in measured)  # type: ignore[operator]
        prompt = sum(s.prompt_tokens for s in measured)
        hit = sum(s.cached_tokens for s in measured) / prompt
        reusable = reusable_token_share(self.requests[self.warm :], self.config.block_size)
        return {
            "ttft_mean": statistics.fmean(ttfts),
            "ttft_p50": ttfts[len(ttfts) // 2],
            "ttft_p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
            "hit": hit,
            "of_reusable": hit / reusable if reusable else 0.0,
        }


def router_policy(config: RouterConfig) -> Policy:
    """The product's ``KVRouter`` with ``config`` (fresh per simulation)."""
    routers: dict[int, KVRouter] = {}

    def choose(sim: Simulation, seq: SimSequence) -> int:
        router = routers.setdefault(id(sim), KVRouter(config))
        overlaps = sim.overlaps(seq, config.mode == "approximate")
        hashes = list(range(len(seq.keys)))  # only their count matters to the chooser
        decision = router.choose(str(seq.index), hashes, sim.candidates(), overlaps)
        return int(decision.winner.rsplit("-", 1)[1])

    return choose


PRODUCT = RoutingOptions(seed=0)  # the control plane's default weights
POLICIES: dict[str, Callable[[], Policy]] = {
    "kv": lambda: router_policy(PRODUCT.router_config("kv")),
    "approximate": lambda: router_policy(PRODUCT.router_config("approximate")),
    "approximate-ttl": lambda: router_policy(PRODUCT.router_config("approximate")),
    "kv-dynamo": lambda: router_policy(RouterConfig("kv", seed=0)),  # Dynamo's cost
    "approximate-dynamo": lambda: router_policy(RouterConfig("approximate", seed=0)),
    "least-loaded": lambda: router_policy(PRODUCT.router_config("least-loaded")),
    "round-robin": lambda: router_policy(RouterConfig("round-robin", seed=0)),
}


# Policies of ours: their engines report prefill progress, and an eviction cancels a
# predicted block. Dynamo's router counts a prompt whole until its first token, and
# round-robin reads no load.
OURS = frozenset({"kv", "approximate", "approximate-ttl", "least-loaded"})


def engine_config(ours: bool) -> MockerConfig:
    """The mocker at the timing matched to Dynamo's; Dynamo's mocker evicts plain LRU
    (its ``LRUEvictor``), ours the pool's segmented LRU at its default share."""
    timing = matched_timing(64)
    if ours:
        return MockerConfig(**timing)
    return MockerConfig(**timing, prefix_cache_protected_share=0.0)


def main(argv: list[str] | None = None) -> None:
    from bench.routing.router_sim_queue import RouterQueueSimulation  # it imports this module

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--slices", default="3000:3150,3300:3450")
    parser.add_argument("--speedups", default="3")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--policies", default="kv,approximate,kv-dynamo,round-robin")
    parser.add_argument("--baseline", default="kv-dynamo", help="ratios are against it")
    parser.add_argument(
        "--router-queue",
        default="",
        help="THRESHOLD_BLOCKS[:MAX_WAIT_MS],...: also run kv with a router-side queue "
        "(RouterQueueSimulation), once per setting",
    )
    parser.add_argument(
        "--engine-orders",
        default="",
        help="ORDER,...: also run kv with engines that order their prefills so "
        "(sim_engine.EngineOrder: srpt, short:TOKENS, cap:TOKENS; an experiment)",
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="run the N requests before each slice first, unmeasured (trace_replay --warm)",
    )
    parser.add_argument(
        "--no-prefill-progress",
        action="store_true",
        help="the router counts a prompt's prefill whole until its first token",
    )
    parser.add_argument(
        "--predictions-outlive-evictions",
        action="store_true",
        help="a routed prompt's blocks count as held for the whole TTL, evicted or not "
        "(the router before 2026-12-05)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    rows = []
    for text in args.slices.split(","):
        warm_requests, measured = warm_and_slice(trace, parse_slice(text), args.warm)
        requests, warm = warm_requests + measured, len(warm_requests)
        progress = not args.no_prefill_progress
        outlive = args.predictions_outlive_evictions

        for speedup in (float(s) for s in args.speedups.split(",")):
            runs = [
                (
                    name,
                    Simulation(
                        requests,
                        speedup,
                        args.actors,
                        POLICIES[name](),
                        warm=warm,
                        config=engine_config(name in OURS),
                        prefill_progress=progress and name in OURS,
                        predictions_outlive_evictions=outlive or name not in OURS,
                        approx_cache="engine" if name == "approximate" else "ttl",
                    ),
                )
                for name in args.policies.split(",")
            ]
            for setting in filter(None, args.router_queue.split(",")):
                threshold, _, wait = setting.partition(":")
                queued = RouterQueueSimulation(
                    requests,
                    speedup,
                    args.actors,
                    POLICIES["kv"](),
                    threshold_blocks=int(threshold),
                    max_wait_ms=float(wait) if wait else None,
                    warm=warm,
                    prefill_progress=progress,
                    predictions_outlive_evictions=outlive,
                )
                runs.append((f"kv+queue {setting}", queued))
            for order in filter(None, args.engine_orders.split(",")):
                reordered = Simulation(
                    requests,
                    speedup,
                    args.actors,
                    POLICIES["kv"](),
                    engine_order=order,
                    warm=warm,
                    prefill_progress=progress,
                    predictions_outlive_evictions=outlive,
                )
                runs.append((f"kv, engines {order}", reordered))
            for name, simulation in runs:
                result = simulation.run()
                rows.append({"slice": text, "speedup": speedup, "policy": name, **result})
                print(
                    f"{text:>10} x{speedup:<4g} {name:<18} TTFT mean {result['ttft_mean']:8.0f}"
                    f" p50 {result['ttft_p50']:8.0f} p99 {result['ttft_p99']:8.0f} ms"
                    f"  hit {result['hit']:.3f} ({result['of_reusable']:.0%} of reusable)"
                )
    summary = ratio_summary(rows, args.baseline)
    for name, row in summary.items():
        print(
            f"{name:<18} over {args.baseline}: TTFT mean geo {row['mean_geo']:.3f}"
            f" (max {row['mean_max']:.3f}), p99 geo {row['p99_geo']:.3f}"
            f" (max {row['p99_max']:.3f});"
            f" of reusable {row['reuse_min']:.0%}..{row['reuse_max']:.0%}"
        )
    if args.out:
        report = {"command": sys.argv, "rows": rows, "over_baseline": summary}
        args.out.write_text(json.dumps(report, indent=1))


def ratio_summary(rows: list[dict[str, Any]], baseline: str) -> dict[str, dict[str, float]]:
    """Per policy: its TTFT mean and p99 over the baseline's on each (slice, speed-up),
    as a geometric mean and a maximum, and the range of its share of the reusable hits."""
    base = {(r["slice"], r["speedup"]): r for r in rows if r["policy"] == baseline}
    out = {}
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name and (r["slice"], r["speedup"]) in base]
        if not mine:
            continue
        means = [r["ttft_mean"] / base[r["slice"], r["speedup"]]["ttft_mean"] for r in mine]
        p99s = [r["ttft_p99"] / base[r["slice"], r["speedup"]]["ttft_p99"] for r in mine]
        reuse = [r["of_reusable"] for r in mine]
        out[name] = {
            "mean_geo": statistics.geometric_mean(means),
            "mean_max": max(means),
            "p99_geo": statistics.geometric_mean(p99s),
            "p99_max": max(p99s),
            "reuse_min": min(reuse),
            "reuse_max": max(reuse),
        }
    return out


if __name__ == "__main__":
    main()
