"""Where the control plane's CPU goes, from ``py-spy record --format raw`` profiles.

Each sample's stack is put in the first bucket whose frame it contains (``BUCKETS``, in
order), so the shares add up to 1. Samples in ``EpollSelector.select`` are the event loop
waiting (py-spy counts a thread in a syscall as active), reported apart and left out of
the shares of work. With ``--cpu-ms NAME=MS`` (the measured control-plane CPU per
request of that profile's run) the shares are turned into ms per request.

    py-spy record --pid PID --rate 200 --format raw -o base.txt   # during a replay
    .venv/bin/python -m bench.routing.profile_buckets base=base.txt this=this.txt \\
        --cpu-ms base=24.9 --cpu-ms this=20.8 --out bench/results/control_plane_cpu_profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

IDLE = "EpollSelector.select"
BUCKETS = (
    ("KV events: parse records", "KVEventRecord.from_dict"),
    ("KV events: prefix index (hashing, tree)", "PrefixIndex.apply"),
    ("token stream frames (msgpack)", "read_frame"),
    ("deltas: dispatch to requests", "ActorHandle._read"),
    ("SSE: format + send deltas", "TokenEventResponse"),
    ("request body: JSON", "read_json"),
    ("request body: validate", "parse_completion"),
    ("routing: choose (hash, match, note)", "ModelRouting.choose"),
    ("prepare (worker thread)", "ServingService.prepare"),
    ("admission + submit", "ServingService.enter"),
    ("streaming bookkeeping", "ServingService.generate"),
    ("Dask actor calls", "distributed/"),
    ("HTTP server (uvicorn, starlette)", "uvicorn/"),
    ("threads (to_thread pool)", "concurrent/futures/thread.py"),
)


def buckets(path: Path) -> dict[str, Any]:
    counts: dict[str, int] = {}
    idle = total = 0
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        samples = int(number)
        total += samples
        if IDLE in stack.rsplit(";", 1)[-1]:
            idle += samples
            continue
        name = next((label for label, frame in BUCKETS if frame in stack), "other")
        counts[name] = counts.get(name, 0) + samples
    work = total - idle
    shares = {k: counts.get(k, 0) / work for k in [b[0] for b in BUCKETS] + ["other"]}
    return {"samples": total, "idle_share": idle / total, "work_shares": shares}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", help="NAME=PATH of a py-spy raw profile")
    parser.add_argument("--cpu-ms", action="append", default=[], help="NAME=MS per request")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    cpu = {k: float(v) for k, v in (item.split("=", 1) for item in args.cpu_ms)}
    result: dict[str, Any] = {}
    for item in args.profiles:
        name, path = item.split("=", 1)
        result[name] = buckets(Path(path))
        if name in cpu:
            result[name]["cpu_ms_per_request"] = cpu[name]
            result[name]["ms_per_request"] = {
                k: share * cpu[name] for k, share in result[name]["work_shares"].items()
            }
    names = list(result)
    print(f"{'bucket':42}" + "".join(f"{n:>14}" for n in names))
    for label in result[names[0]]["work_shares"]:
        cells = []
        for n in names:
            row = result[n]
            ms = row.get("ms_per_request", {}).get(label)
            share = row["work_shares"][label]
            cells.append(f"{share:6.1%}" + (f" {ms:5.1f}ms" if ms is not None else ""))
        print(f"{label:42}" + "".join(f"{c:>14}" for c in cells))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
