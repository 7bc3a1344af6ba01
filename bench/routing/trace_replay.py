"""Replays a Mooncake-format trace against dynask's router and NVIDIA Dynamo's, in one run.

The same slice of the trace (``--slice``), at the trace's own arrival times scaled by
``--speedup``, goes to each target in turn (``--targets``):

* ``dynask:MODE`` (MODE: kv, approximate, round-robin, random, least-loaded): one
  ``bench.routing.server`` process, ``--actors`` mocker actors on ``--workers`` Dask
  worker processes, the mode chosen per request (``router_mode``). Each dynask phase gets
  its own prompt tokens (``PromptBuilder(salt)``), so none hits another's cache, and
  starts with the engines' prefix caches emptied (``POST
  /v1/engines/reset_prefix_cache``), as Dynamo's mockers start fresh per mode.
* ``dynask-2cp:MODE`` and ``dynask-2cp-unsynced:MODE``: router replicas, two control
  planes of that server process in front of the same actors, the slice's requests sent
  to them in turn (``trace_client.replay``); the first pair shares what it routes
  (``--router-replica-sync``), the second does not. ``dynask:MODE`` uses the first of
  the pair alone, so the three compare one control plane with two on the same actors.
* ``endpoints:MODE``: ``--endpoints URL1,URL2`` of servers already running (two
  ``dynask serve`` processes in front of the same actors), in turn, model ``--model``.
* ``dynamo:MODE`` (kv, approximate = kv with ``--no-router-kv-events``, round-robin,
  random): Dynamo 1.6.1's frontend with that ``--router-mode`` and one mocker process
  with ``--num-workers`` = ``--actors``, from the peer install (``../shared/peers/dynamo``),
  started fresh per mode.

Mocker timing, matched (``matched_timing``): both sides run at speed-up 1 with the same
block size (``--block-size``, default 64 = Dynamo's vLLM mocker default), 16,384 KV blocks
per engine, 256 sequences and 8,192 batched tokens per step, chunked prefill and prefix
caching; dynask's mocker is given Dynamo's own timing fit (measured on this machine, see
``../shared/peers/dynamo/README.md``): prefill 4.2e-7·T² + 0.0152·T + 16.5 ms per step
of T uncached tokens, decode 5.74 + 54.01·u − 25.74·u² ms per step at u = the decoding
sequences' KV blocks over all blocks (Dynamo's polynomial; measured here with 1 worker:
16 sequences of 8k tokens decode at 11.8 ms/token, u = 0.12 gives 11.96; 32 of 16k at
23.5, u = 0.49 gives 26.2). Both mockers make a step last its model time, host work
included. The caches differ as the engines do: Dynamo's mocker evicts plain LRU, ours
the pool's segmented LRU (``kv.free_queue``; ``--dynask-engine-args
'{"prefix_cache_protected_share": 0}'`` makes ours plain LRU too).

``--warm N`` replays the N requests before the slice first, on the same clock and tokens
(the trace running on into the slice), so the slice meets the caches and the queues its
earlier turns left; only the slice is measured, and its reusable share counts the blocks
the warm requests brought.

Reported per target: TTFT mean/p50/p90/p99, ITL, E2E, requests/s, the KV hit rate the
engines report, and the trace's own reusable share (``trace.reusable_token_share``): the
hit rate an infinite cache would reach. Ratios are against Dynamo's kv on the same slice.

    .venv/bin/python -m bench.routing.trace_replay --slice 3000:3200 --speedup 8
    .venv/bin/python -m bench.routing.trace_replay --targets dynask:kv,dynamo:kv --slice 0:50
    .venv/bin/python -m bench.routing.trace_replay --slice 3600:3750 --speedup 2 \\
        --targets dynask:kv,dynask-2cp:kv,dynask-2cp-unsynced:kv

Prints a table; writes JSON and a PNG to ``bench/results/trace_replay.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common.paths import shared_path
from bench.common.plots import plot
from bench.common.processes import group_cpu_seconds
from bench.common.report import code_version, machine_facts, write_json
from bench.routing.trace import (
    PromptBuilder,
    TraceRequest,
    load_trace,
    parse_slice,
    reusable_block_share,
    reusable_token_share,
    warm_and_slice,
)
from bench.routing.trace_client import (
    ReplayResult,
    kv_hit_rate,
    replay,
    reset_prefix_caches,
    summarize,
)
from bench.routing.trace_systems import (
    DYNAMO_MODEL,
    DYNASK_PLANES,
    dynamo_stack,
    dynask_server,
    matched_timing,
)

REPO = Path(__file__).resolve().parents[2]
TRACE = shared_path("traces", "mooncake_synthetic_trace.jsonl")
RESULTS = REPO / "bench" / "results"
DYNASK_MODEL = "bench"  # bench.routing.server.MODEL
DYNASK_MODES = ("kv", "approximate", "round-robin", "random", "least-loaded")
DYNAMO_MODES = ("kv", "approximate", "round-robin", "random")
SYSTEMS = {
    **dict.fromkeys(DYNASK_PLANES, DYNASK_MODES),
    "dynamo": DYNAMO_MODES,
    "endpoints": DYNASK_MODES,
}
DEFAULT_TARGETS = "dynask:kv,dynask:approximate,dynask:round-robin,dynamo:kv,dynamo:round-robin"
Slice = tuple[list[TraceRequest], list[TraceRequest]]  # (warm, measured), in trace order


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--slice", default="3000:3200", help="START:STOP of the trace's requests")
    parser.add_argument("--speedup", type=float, default=8.0, help="arrival times divided by this")
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="the N requests before the slice are replayed first, unmeasured (default 0)",
    )
    parser.add_argument("--targets", default=DEFAULT_TARGETS, help="SYSTEM:MODE,...")
    parser.add_argument("--actors", type=int, default=8, help="mocker engines per system")
    parser.add_argument("--workers", type=int, default=2, help="dynask's Dask worker processes")
    parser.add_argument("--block-size", type=int, default=64, help="KV block tokens, both sides")
    parser.add_argument("--kv-overlap-weight", help="dynask's w (default: the product's)")
    parser.add_argument("--kv-decode-weight", help="dynask's decode weight (default: product's)")
    parser.add_argument("--kv-recompute-weight", help="dynask's r (default: the product's)")
    parser.add_argument(
        "--dynask-engine-args",
        type=json.loads,
        default={},
        help="JSON: mocker arguments over the matched timing, dynask's side only",
    )
    parser.add_argument("--endpoints", default="", help="URL1,URL2: running servers (endpoints:)")
    parser.add_argument("--model", default=DYNASK_MODEL, help="the model name at --endpoints")
    parser.add_argument("--out", type=Path, default=RESULTS / "trace_replay.json")
    args = parser.parse_args(argv)
    args.endpoint_list = [url.rstrip("/") for url in args.endpoints.split(",") if url]
    args.target_list = [_parse_target(t) for t in args.targets.split(",") if t]
    return args


def _parse_target(text: str) -> tuple[str, str]:
    system, _, mode = text.partition(":")
    modes = SYSTEMS.get(system)
    if modes is None or mode not in modes:
        raise SystemExit(
            f"--targets entry {text!r}: expected SYSTEM:MODE, SYSTEM one of "
            f"{', '.join(SYSTEMS)}; dynamo's modes {', '.join(DYNAMO_MODES)}, the others' "
            f"{', '.join(DYNASK_MODES)}"
        )
    return system, mode


# ---- one run -----------------------------------------------------------------------------


async def warm_up(base_urls: list[str], model: str, extra: dict[str, Any], count: int) -> None:
    """Short requests of their own tokens to each endpoint, so first-call costs stay out
    of the phase."""
    for url in base_urls:
        warm = [TraceRequest(i * 10.0, 300, 2, (10_000_000 + i,)) for i in range(count)]
        _, results = await replay(
            url, model, warm, speedup=1.0, builder=PromptBuilder(salt=-1), extra_body=extra
        )
        failed = [r.record.failure(2) for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"warm-up against {url} failed: {failed[0]}")


def run_phase(
    base_urls: list[str],
    groups: list[int],
    model: str,
    requests: Slice,
    args: argparse.Namespace,
    salt: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """One replay of the slice, sent to ``base_urls`` in turn; with the serving processes'
    CPU seconds it took (the machine is shared: a stack that needs more CPU than it gets
    falls behind its model time, so the CPU each one spends is reported beside its
    latencies). The warm requests go first on the same clock and tokens, as the trace
    runs on into the slice; only the slice's are measured (its wall from its first
    request's due time)."""
    warm, measured = requests
    asyncio.run(warm_up(base_urls, model, extra, args.actors))
    cpu_before = sum(group_cpu_seconds(group) for group in groups)
    wall, results = asyncio.run(
        replay(
            base_urls,
            model,
            [*warm, *measured],
            speedup=args.speedup,
            builder=PromptBuilder(salt),
            extra_body=extra,
        )
    )
    row = measured_summary(wall, results, len(warm))
    row["server_cpu_s"] = sum(group_cpu_seconds(group) for group in groups) - cpu_before
    return row


def measured_summary(wall: float, results: list[ReplayResult], warm: int) -> dict[str, Any]:
    """``summarize`` of the results after the first ``warm`` (the slice's), its wall time
    from the first of them's due time; the warm ones' count, successes and hit rate."""
    warm_results, measured = results[:warm], results[warm:]
    row = summarize(wall - measured[0].scheduled_s, measured)
    if warm_results:
        row["warm"] = {
            "requests": len(warm_results),
            "requests_ok": sum(r.ok for r in warm_results),
            "kv_hit_rate": kv_hit_rate(warm_results),
        }
    return row


def run_dynask(
    args: argparse.Namespace,
    requests: Slice,
    server: tuple[dict[str, list[str]], list[int]],
    targets: list[tuple[str, str]],
    rows: list[dict[str, Any]],
) -> None:
    """The dynask and endpoints targets, in order, each with its own tokens (salt); the
    server's URLs and process group (none for endpoints)."""
    urls, groups = server
    for index, (system, mode) in enumerate(targets):
        if system == "endpoints":
            base_urls, model = args.endpoint_list, args.model
        else:
            kind, count = DYNASK_PLANES[system]
            base_urls, model = urls[kind][:count], DYNASK_MODEL
        # Every phase starts cold, as Dynamo's fresh mockers do: the last one's blocks
        # (segmented LRU protects the reused ones) would otherwise crowd this one's.
        every_url = (
            args.endpoint_list if system == "endpoints" else [u for g in urls.values() for u in g]
        )
        for url in every_url:
            reset_prefix_caches(url)
        lag_before = [peer_lag(url, model) for url in base_urls]
        extra = {"router_mode": mode}
        row = run_phase(base_urls, groups, model, requests, args, index + 1, extra)
        row["routing"] = routing_summary(base_urls, len(requests))
        row["peer_lag"] = lag_summary(lag_before, [peer_lag(url, model) for url in base_urls])
        row["endpoints"] = len(base_urls)
        row["caches_reset"] = True  # the phase began with the engines' caches emptied
        rows.append({"system": system, "mode": mode, **row})
        print(format_row(rows[-1]), file=sys.stderr)


def run_all(args: argparse.Namespace, requests: Slice, workdir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    dynask_targets = [(s, m) for s, m in args.target_list if s in DYNASK_PLANES]
    external = [(s, m) for s, m in args.target_list if s == "endpoints"]
    dynamo_modes = [mode for system, mode in args.target_list if system == "dynamo"]
    if external and not args.endpoint_list:
        raise SystemExit("endpoints: targets need --endpoints URL1,URL2")
    if external:
        run_dynask(args, requests, ({}, []), external, rows)
    if dynask_targets:
        with dynask_server(args, workdir) as server:
            run_dynask(args, requests, server, dynask_targets, rows)
    for mode in dynamo_modes:
        with dynamo_stack(args, mode, workdir) as (base_url, groups):
            row = run_phase([base_url], groups, DYNAMO_MODEL, requests, args, 100, {})
            rows.append({"system": "dynamo", "mode": mode, **row})
            print(format_row(rows[-1]), file=sys.stderr)
    return rows


def routing_summary(base_urls: list[str], count: int) -> dict[str, Any]:
    """From dynask's decision logs (each endpoint's share of the ``count`` requests, sent
    round robin): requests per actor, and the winners' mean overlap."""
    decisions = []
    for number, url in enumerate(base_urls):
        share = len(range(number, count, len(base_urls)))
        response = httpx.get(f"{url}/v1/routing/decisions", params={"limit": share}, timeout=30.0)
        response.raise_for_status()
        body = response.json()
        decisions += body["data"] if isinstance(body, dict) else body
    winners: dict[str, int] = {}
    overlap = prompt = 0
    for decision in decisions:
        winners[decision["winner"]] = winners.get(decision["winner"], 0) + 1
        won = next(c for c in decision["candidates"] if c["actor"] == decision["winner"])
        overlap += won["overlap_blocks"]
        prompt += decision["prompt_blocks"]
    return {
        "requests_per_actor": dict(sorted(winners.items())),
        "winner_overlap_share": overlap / prompt if prompt else None,
        "mean_compute_us": sum(d["compute_us"] for d in decisions) / max(1, len(decisions)),
    }


def peer_lag(base_url: str, model: str) -> dict[str, float]:
    """``dynask_routing_peer_lag_seconds`` of one control plane: its buckets, sum, count."""
    text = httpx.get(f"{base_url}/metrics", timeout=30.0).text
    series: dict[str, float] = {}
    prefix = "dynask_routing_peer_lag_seconds_"
    for line in text.splitlines():
        if line.startswith(prefix) and f'model="{model}"' in line:
            name, value = line.rsplit(" ", 1)
            kind = name.removeprefix(prefix).split("{")[0]  # bucket, count, sum, created
            if kind == "bucket":
                kind = "le " + name.split('le="')[1].split('"')[0]
            series[kind] = float(value)
    return series


def lag_summary(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, Any]:
    """How late the peers' routings reached the control planes during the phase: how many,
    the mean, and the smallest bucket bound that held 99% of them (ms)."""
    delta: dict[str, float] = {}
    for old, new in zip(before, after, strict=True):
        for key, value in new.items():
            delta[key] = delta.get(key, 0.0) + value - old.get(key, 0.0)
    count = delta.get("count", 0.0)
    if not count:
        return {"count": 0, "mean_ms": None, "p99_bound_ms": None}
    bounds = sorted(
        (float(key.removeprefix("le ")), held)
        for key, held in delta.items()
        if key.startswith("le ") and key != "le +Inf"
    )
    p99 = next((bound * 1000 for bound, held in bounds if held >= 0.99 * count), None)
    return {"count": int(count), "mean_ms": delta["sum"] / count * 1000, "p99_bound_ms": p99}


# ---- report --------------------------------------------------------------------------------

HEADER = (
    f"{'target':<28} {'ok':>4} {'req/s':>6} {'TTFT avg':>9} {'p50':>8} {'p90':>8} {'p99':>8} "
    f"{'ITL p50':>8} {'E2E p50':>8} {'hit':>6} {'lag max':>8} {'CPU s':>6}"
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def format_row(row: dict[str, Any]) -> str:
    ttft, hit = row["ttft_ms"], row["kv_hit_rate"]
    return (
        f"{row['system'] + ':' + row['mode']:<28} {row['requests_ok']:>4} "
        f"{row['req_per_s'] or 0:>6.2f} {_ms(ttft['mean']):>9} {_ms(ttft['p50']):>8} "
        f"{_ms(ttft['p90']):>8} {_ms(ttft['p99']):>8} {_ms(row['itl_ms']['p50']):>8} "
        f"{_ms(row['e2e_ms']['p50']):>8} {'-' if hit is None else f'{hit:.3f}':>6} "
        f"{_ms(row['send_lag_ms']['max']):>8} {row['server_cpu_s']:>6.1f}"
    )


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each target's TTFT mean and p99 over Dynamo kv's (below 1: faster than Dynamo kv)."""
    base = next((r for r in rows if r["system"] == "dynamo" and r["mode"] == "kv"), None)
    if base is None:
        return {}
    out = {}
    for row in rows:
        out[f"{row['system']}:{row['mode']}"] = {
            stat: (row["ttft_ms"][stat] / base["ttft_ms"][stat])
            if row["ttft_ms"][stat] and base["ttft_ms"][stat]
            else None
            for stat in ("mean", "p99")
        }
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    trace = load_trace(args.trace)
    warm, requests = warm_and_slice(trace, parse_slice(args.slice), args.warm)
    if not requests:
        raise SystemExit(f"--slice {args.slice} of {args.trace} holds no request")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trace-replay-") as tmp:
        try:
            rows = run_all(args, (warm, requests), Path(tmp))
        except BaseException:
            logs = Path(tempfile.gettempdir()) / "trace_replay_logs"  # kept for a failed run
            with contextlib.suppress(OSError):
                shutil.copytree(tmp, logs, dirs_exist_ok=True, ignore=_not_logs)
            print(f"the processes' logs are in {logs}", file=sys.stderr)
            raise
    share = {
        "blocks_512": reusable_block_share(requests, warm),
        "tokens_engine_blocks": reusable_token_share(requests, args.block_size, warm),
        # what the slice alone can reuse, as if nothing came before it
        "tokens_engine_blocks_slice_only": reusable_token_share(requests, args.block_size),
    }
    print(HEADER)
    for row in rows:
        print(format_row(row))
        hit = row["kv_hit_rate"]
        row["hit_rate_of_reusable"] = hit / share["tokens_engine_blocks"] if hit else None
        alone = share["tokens_engine_blocks_slice_only"]
        row["hit_rate_of_slice_reusable"] = hit / alone if hit and alone else None
    ttft_ratios = ratios(rows)
    print(f"trace reusable share: {share}; TTFT / dynamo:kv: {json.dumps(ttft_ratios)}")
    document = {
        "benchmark": "bench.routing.trace_replay",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "trace": str(args.trace),
        "slice": args.slice,
        "speedup": args.speedup,
        "warm": len(warm),
        "actors": args.actors,
        "block_size": args.block_size,
        "matched_timing": matched_timing(args.block_size),
        "dynask_engine_args": args.dynask_engine_args,
        "dynask_weights": {
            "overlap": args.kv_overlap_weight,
            "decode": args.kv_decode_weight,
            "recompute": args.kv_recompute_weight,
        },
        "reusable_share": share,
        "trace_rows": rows,
        "ttft_over_dynamo_kv": ttft_ratios,
        "code": code_version(REPO),
        "machine": machine_facts(load_start),
    }
    write_json(args.out, document)
    print(f"wrote {args.out} and {plot(args.out)}")
    return 0


def _not_logs(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".log") and not Path(folder, n).is_dir()] + [
        n for n in names if n.startswith(("smollm2-tok", "kvstore"))
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
