"""Why the slowest requests of a simulated replay were slow: the router's beliefs against
the engines' truth, where the hits went, and how busy the engines were.

``router_sim`` says how fast a policy is; this module says what limits it. It replays one
slice at one speed-up with the product's ``kv`` router (``router_sim.Simulation``) and,
at every routing decision, notes per actor what the router believed (its overlap, its
count of queued prefill blocks) and what was true (the prefix the engine held, the
prefill work actually left in its queue, known once the run is over).

    .venv/bin/python -m bench.routing.router_sim_tail --slice 2000:2600 --speedup 3.5 --warm 600

Design decisions:

- The truth of a queue is counted after the run: a waiting prompt's work is only known
  at its admission (its prefix may be evicted, or computed by an earlier prompt, while
  it waits), so each decision keeps which prompts were queued and how far each was,
  and their remaining work is summed once every prompt has run (a preempted prompt's
  recompute is not counted: ``preemptions`` says whether there was any). The work of a
  step in flight is not "left": the engine committed it when the step began.
- The hit accounting is over the measured requests, in blocks: ``got`` (hit at
  admission), ``best_held`` (the longest prefix any engine held at the decision),
  ``chosen_held`` (what the chosen engine held then), ``lost_while_queued`` (held by the
  chosen engine at the decision, evicted before admission) and ``gained_while_queued``
  (computed there by an earlier prompt while this one waited). ``best_held`` well above
  ``chosen_held`` means the router sent prompts away from their prefixes; ``got`` near
  ``best_held`` means the hits are what the caches kept.
- ``busy_share`` is the share of the measured window (first measured arrival to last
  first token) each engine spent stepping: at 1.0 no routing can shorten the queues,
  only fewer uncached tokens can.
- ``--num-kv-blocks`` and ``--event-delay-ms`` change the engines' cache size and the KV
  events' delay, for the sensitivity of a result to them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.routing.router_sim import POLICIES, TRACE, Policy, Simulation
from bench.routing.sim_engine import SimEngine, SimSequence
from bench.routing.trace import TraceRequest, load_trace, parse_slice, warm_and_slice
from bench.routing.trace_systems import matched_timing
from dynask.actors.backends.mocker_config import MockerConfig


@dataclass
class Decision:
    """One routing decision: per actor, the router's view and the engine's truth."""

    request: int  # index in the replayed requests (warm ones first)
    at_ms: float
    prompt_blocks: int
    actor: int  # the chosen one
    believed_overlap: list[int]
    held_overlap: list[int]  # the leading blocks each engine held at the decision
    believed_prefill: list[int]  # the router's queued prefill blocks
    queued: list[list[tuple[SimSequence, int]]] = field(repr=False)  # (prompt, done) each
    true_prefill: list[int] = field(default_factory=list)  # filled in after the run


@dataclass(frozen=True)
class HitAccount:
    """Prompt blocks of the measured requests, by what became of their prefixes."""

    prompt: int
    got: int
    best_held: int
    chosen_held: int
    lost_while_queued: int
    gained_while_queued: int


def cache_blocks(engines: Sequence[SimEngine]) -> tuple[int, int]:
    """The cached blocks the engines hold in all (in use or free), and how many distinct
    prefixes those are: the gap is the blocks held on more than one engine."""
    held = [set(engine.refs) | set(engine.free_cached) for engine in engines]
    return sum(len(keys) for keys in held), len(set().union(*held))


class TailSimulation(Simulation):
    """A ``Simulation`` that records every decision and every engine step, and at every
    ``cache_every``-th measured decision the engines' ``cache_blocks``."""

    def __init__(self, *args: Any, cache_every: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache_every = cache_every
        self.cache_samples: list[tuple[int, int]] = []
        self.decisions: dict[int, Decision] = {}
        self.steps: list[list[tuple[float, float]]] = [[] for _ in self.engines]
        self._route = self.policy
        self.policy = self._recorded

    def _recorded(self, sim: Simulation, seq: SimSequence) -> int:
        choice = self._route(sim, seq)
        overlaps = self.overlaps(seq, approximate=False)
        self.decisions[seq.index] = Decision(
            request=seq.index,
            at_ms=self.now_ms,
            prompt_blocks=len(seq.keys),
            actor=choice,
            believed_overlap=[
                overlaps[e.name].total_blocks if e.name in overlaps else 0 for e in self.engines
            ],
            held_overlap=[engine.cached_prefix_blocks(seq) for engine in self.engines],
            believed_prefill=[c.active_prefill_blocks for c in self.candidates()],
            queued=[_queued_prefills(engine.waiting, engine.running) for engine in self.engines],
        )
        if seq.index >= self.warm and (seq.index - self.warm) % self.cache_every == 0:
            self.cache_samples.append(cache_blocks(self.engines))
        return choice

    def _start_step(self, index: int) -> None:
        started = self.now_ms
        super()._start_step(index)
        end = self.engines[index].busy_until
        assert end is not None  # _start_step always sets it
        self.steps[index].append((started, end))

    def run(self) -> dict[str, float]:
        summary = super().run()
        size = self.config.block_size
        for decision in self.decisions.values():
            decision.true_prefill = [
                sum(max(0, s.prompt_tokens - s.cached_tokens - done) for s, done in queue) // size
                for queue in decision.queued
            ]
        return summary

    def measured(self) -> list[SimSequence]:
        return self.sequences[self.warm :]

    def ttft_ms(self, seq: SimSequence) -> float:
        assert seq.first_token_ms is not None  # every prompt runs to its first token
        return seq.first_token_ms - seq.arrival_ms

    def hit_account(self) -> HitAccount:
        lost = gained = 0
        for seq in self.measured():
            decision = self.decisions[seq.index]
            got = seq.cached_tokens // self.config.block_size
            held = decision.held_overlap[decision.actor]
            lost += max(0, held - got)
            gained += max(0, got - held)
        measured = [self.decisions[seq.index] for seq in self.measured()]
        return HitAccount(
            prompt=sum(d.prompt_blocks for d in measured),
            got=sum(seq.cached_tokens // self.config.block_size for seq in self.measured()),
            best_held=sum(max(d.held_overlap) for d in measured),
            chosen_held=sum(d.held_overlap[d.actor] for d in measured),
            lost_while_queued=lost,
            gained_while_queued=gained,
        )

    def busy_share(self) -> list[float]:
        """Per engine, the share of the measured window it spent stepping."""
        measured = self.measured()
        start = measured[0].arrival_ms
        end = max(self.ttft_ms(seq) + seq.arrival_ms for seq in measured)
        return [
            sum(max(0.0, min(b, end) - max(a, start)) for a, b in steps) / (end - start)
            for steps in self.steps
        ]

    def slowest(self, share: float = 0.01) -> list[SimSequence]:
        measured = sorted(self.measured(), key=self.ttft_ms, reverse=True)
        return measured[: max(1, round(share * len(measured)))]


def _queued_prefills(*queues: Sequence[SimSequence]) -> list[tuple[SimSequence, int]]:
    """The prompts still prefilling, with the uncached tokens each has computed so far."""
    return [
        (seq, seq.computed - seq.cached_tokens if seq.computed else 0)
        for queue in queues
        for seq in queue
        if seq.prefilling()
    ]


def tail_report(sim: TailSimulation, first_index: int, share: float) -> dict[str, Any]:
    """The JSON-ready findings of a finished ``TailSimulation``."""
    rows = []
    for seq in sim.slowest(share):
        decision = sim.decisions[seq.index]
        row = {k: v for k, v in asdict(decision).items() if k != "queued"}
        row["request"] = first_index + seq.index - sim.warm  # the trace's line index
        row["ttft_ms"] = sim.ttft_ms(seq)
        row["got"] = seq.cached_tokens // sim.config.block_size
        rows.append(row)
    held = sum(h for h, _ in sim.cache_samples)
    distinct = sum(d for _, d in sim.cache_samples)
    samples = max(1, len(sim.cache_samples))
    return {
        "cache_blocks": {
            "samples": len(sim.cache_samples),
            "held_mean": held / samples,
            "distinct_mean": distinct / samples,
            "duplicate_share": 1 - distinct / held if held else 0.0,
        },
        "hits_in_blocks": asdict(sim.hit_account()),
        "busy_share": sim.busy_share(),
        "preemptions": [engine.preemptions for engine in sim.engines],
        "slowest": rows,
    }


def simulate(
    requests: Sequence[TraceRequest],
    speedup: float,
    warm: int,
    policy: Policy,
    num_kv_blocks: int | None = None,
    event_delay_ms: float = 20.0,
    actors: int = 4,
) -> TailSimulation:
    timing = matched_timing(64)
    if num_kv_blocks is not None:
        timing["num_kv_blocks"] = num_kv_blocks
    return TailSimulation(
        requests,
        speedup,
        actors,
        policy,
        event_delay_ms=event_delay_ms,
        warm=warm,
        config=MockerConfig(**timing),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--slice", default="2000:2600")
    parser.add_argument("--speedup", type=float, default=3.5)
    parser.add_argument("--warm", type=int, default=600)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.01, help="the slowest share shown")
    parser.add_argument("--num-kv-blocks", default="", help="N,...: one run per cache size")
    parser.add_argument("--event-delay-ms", default="20", help="MS,...: one run per delay")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    span = parse_slice(args.slice)
    warm_requests, measured = warm_and_slice(load_trace(args.trace), span, args.warm)
    runs = []
    sizes: list[int | None] = [int(n) for n in args.num_kv_blocks.split(",") if n]
    for blocks in sizes or [None]:
        for delay in (float(ms) for ms in args.event_delay_ms.split(",")):
            sim = simulate(
                warm_requests + measured,
                args.speedup,
                len(warm_requests),
                POLICIES["kv"](),
                num_kv_blocks=blocks,
                event_delay_ms=delay,
                actors=args.actors,
            )
            summary = sim.run()
            report = tail_report(sim, span.start or 0, args.share)
            runs.append(
                {
                    "num_kv_blocks": sim.config.num_kv_blocks,
                    "event_delay_ms": delay,
                    **summary,
                    **report,
                }
            )
            _print(runs[-1])
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "runs": runs}, indent=1))


def _print(run: dict[str, Any]) -> None:
    print(
        f"{run['num_kv_blocks']} blocks, events +{run['event_delay_ms']:g} ms: TTFT mean "
        f"{run['ttft_mean']:.0f} p99 {run['ttft_p99']:.0f} ms, hit {run['hit']:.3f}; "
        f"busy {', '.join(f'{b:.3f}' for b in run['busy_share'])}"
    )
    print(f"  hits in blocks: {run['hits_in_blocks']}")
    cache = run["cache_blocks"]
    print(
        f"  cache: {cache['held_mean']:.0f} blocks held, {cache['distinct_mean']:.0f} distinct "
        f"({cache['duplicate_share']:.1%} on more than one engine; {cache['samples']} samples)"
    )
    for row in run["slowest"]:
        print(
            f"  #{row['request']} ttft {row['ttft_ms']:.0f} ms, {row['prompt_blocks']} blocks, "
            f"got {row['got']} -> actor {row['actor']}; overlap believed "
            f"{row['believed_overlap']} held {row['held_overlap']}; queued prefill believed "
            f"{row['believed_prefill']} true {row['true_prefill']}"
        )


if __name__ == "__main__":
    main()
