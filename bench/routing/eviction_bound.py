"""How many prefix hits an eviction policy leaves on a trace slice, against the best any
policy could get: plain LRU, the pool's segmented LRU and Belady's offline optimum, each
one cache of trace blocks with requests served one after another.

``router_sim`` measures what a policy does under load; this asks how far the policy is
from what the trace allows, without queues, routing or timing. On the Mooncake slices
that overflow four engines' caches (8,192 trace blocks in all) it says the gap is the
eviction policy's, not the capacity's: Belady hits what an infinite cache would.

    .venv/bin/python -m bench.routing.eviction_bound --slices 2000:2600,1500:2100 --warm 600

Design decisions:

- A request is served whole before the next: its leading blocks in the cache count as
  hits (measured requests only), then every block of its prompt is touched, the tail
  first, so its head is the most recently used (the pool frees a request tail first).
- Segmented LRU follows ``kv.free_queue.SegmentedFreeQueue``: a block touched while
  cached is protected, the protected segment holds at most ``protected_share`` of the
  cache and demotes its least recently used to probation's most recent end, and
  probation is evicted first.
- Belady evicts the block whose next use is furthest (never: first); among equal next
  uses, the deepest block in its prompt, so a prefix outlives its tail.
- Reuse statistics (``reuse_of``): of the blocks each request touches, the share a later
  request of the slice touches again, split by whether the block was already hit
  before, was new in a request that hit nothing, or was new after a hit.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common.paths import REPO
from bench.common.report import code_version, write_json
from bench.routing.router_sim import TRACE
from bench.routing.trace import TraceRequest, load_trace, parse_slice, warm_and_slice
from bench.routing.trace_replay import RESULTS

NEVER = sys.maxsize


def _leading_hits(request: TraceRequest, cached: Any) -> int:
    count = 0
    for block in request.hash_ids:
        if block not in cached:
            break
        count += 1
    return count


def lru_hits(requests: Sequence[TraceRequest], warm: int, capacity: int) -> float:
    """The share of the measured prompt blocks plain LRU hits."""
    return segmented_hits(requests, warm, capacity, protected_share=0.0)


def segmented_hits(
    requests: Sequence[TraceRequest], warm: int, capacity: int, protected_share: float = 0.5
) -> float:
    """The share of the measured prompt blocks segmented LRU hits (``protected_share``
    0 is plain LRU)."""
    probation: OrderedDict[int, None] = OrderedDict()
    protected: OrderedDict[int, None] = OrderedDict()
    limit = int(capacity * protected_share)
    hits = total = 0
    for index, request in enumerate(requests):
        if index >= warm:
            hits += _leading_hits(request, probation.keys() | protected.keys())
            total += len(request.hash_ids)
        for block in reversed(request.hash_ids):
            if block in protected:
                protected.move_to_end(block)
            elif block in probation:
                del probation[block]
                protected[block] = None
            else:
                probation[block] = None
        while len(protected) > limit:
            demoted, _ = protected.popitem(last=False)
            probation[demoted] = None
        while len(probation) + len(protected) > capacity:
            (probation if probation else protected).popitem(last=False)
    return hits / total if total else 0.0


def belady_hits(requests: Sequence[TraceRequest], warm: int, capacity: int) -> float:
    """The share of the measured prompt blocks the offline optimum hits."""
    next_use: list[list[int]] = [[] for _ in requests]
    seen: dict[int, int] = {}
    for index in range(len(requests) - 1, -1, -1):
        next_use[index] = [seen.get(block, NEVER) for block in requests[index].hash_ids]
        seen.update((block, index) for block in requests[index].hash_ids)
    cached: dict[int, int] = {}  # block -> its next use
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, block); stale entries skipped
    hits = total = 0
    for index, request in enumerate(requests):
        if index >= warm:
            hits += _leading_hits(request, cached)
            total += len(request.hash_ids)
        for depth, (block, use) in enumerate(zip(request.hash_ids, next_use[index], strict=True)):
            cached[block] = use
            heapq.heappush(heap, (-use, -depth, block))
        while len(cached) > capacity:
            use, _, block = heapq.heappop(heap)
            if cached.get(block) == -use:
                del cached[block]
    return hits / total if total else 0.0


def reuse_of(requests: Sequence[TraceRequest]) -> dict[str, float]:
    """Of the blocks requests touch, the share a later request touches again, by kind."""
    later: list[list[bool]] = [[] for _ in requests]
    future: set[int] = set()
    for index in range(len(requests) - 1, -1, -1):
        later[index] = [block in future for block in requests[index].hash_ids]
        future.update(requests[index].hash_ids)
    counts = {kind: [0, 0] for kind in ("hit_before", "new_no_hit", "new_after_hit")}
    seen: set[int] = set()
    for index, request in enumerate(requests):
        hit = _leading_hits(request, seen)
        for position, reused in enumerate(later[index]):
            new = "new_after_hit" if hit else "new_no_hit"
            kind = "hit_before" if position < hit else new
            counts[kind][0] += reused
            counts[kind][1] += 1
        seen.update(request.hash_ids)
    return {kind: again / blocks if blocks else 0.0 for kind, (again, blocks) in counts.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--slices", default="2000:2600,1500:2100,2500:3100,3000:3600")
    parser.add_argument("--warm", type=int, default=600)
    parser.add_argument(
        "--capacity", type=int, default=8192, help="trace blocks (4 engines x 16,384 x 64 / 512)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "eviction_bound.json")
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    rows = []
    print(
        f"{'slice':>10} {'LRU':>7} {'segmented':>10} {'Belady':>7}   (hits, {args.capacity} blocks)"
    )
    for text in args.slices.split(","):
        warm, measured = warm_and_slice(trace, parse_slice(text), args.warm)
        requests = warm + measured
        row = {
            "slice": text,
            "lru": lru_hits(requests, len(warm), args.capacity),
            "segmented": segmented_hits(requests, len(warm), args.capacity),
            "belady": belady_hits(requests, len(warm), args.capacity),
        }
        rows.append(row)
        print(f"{text:>10} {row['lru']:7.3f} {row['segmented']:10.3f} {row['belady']:7.3f}")
    reuse = reuse_of(trace[:6000])
    print(
        "reused later, first 6,000 requests: " + ", ".join(f"{k} {v:.2f}" for k, v in reuse.items())
    )
    document = {
        "benchmark": "bench.routing.eviction_bound",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "trace": str(args.trace),
        "warm": args.warm,
        "capacity_trace_blocks": args.capacity,
        "rows": rows,
        "reused_later_first_6000": reuse,
        "code": code_version(REPO),
    }
    write_json(args.out, document)


if __name__ == "__main__":
    main()
