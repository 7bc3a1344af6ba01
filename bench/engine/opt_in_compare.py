"""The CUDA fast paths against the kernels of before, from two runs of one tree.

(The module's name is from when the fast paths were opt-in; they are on by default on
CUDA since 2026-12-01.) ``bench/h200_optin.sh`` runs ``bench.engine.throughput`` twice in
the same tree with the same arguments, with ``--no-cuda-fast-paths`` then with
``--cuda-fast-paths``; this reads the two JSON files and prints, per measure, off, on
and on / off (a rate: > 1 is faster; a time: < 1 is faster), then writes them and both
reports to ``--out``::

    python3 -m bench.engine.opt_in_compare OFF.json ON.json --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def measures(report: dict[str, Any]) -> dict[str, float]:
    """The numbers compared: decode and overall tok/s per batch, prefill tok/s, TTFT ms."""
    found: dict[str, float] = {}
    for row in report.get("throughput", []):
        found[f"batch {row['batch']} tok/s"] = row["ours_tok_s"]
        if row.get("ours_decode_tok_s") is not None:
            found[f"batch {row['batch']} decode tok/s"] = row["ours_decode_tok_s"]
    for row in report.get("prefill", []):
        found[f"prefill {row['prompt_len']} tok/s"] = row["tok_s"]
    ttft = report.get("ttft")
    if ttft:
        found[f"TTFT {ttft['prompt_len']} cold ms"] = ttft["cold_ms"]
        found[f"TTFT {ttft['prompt_len']} cached ms"] = ttft["cached_ms"]
    return found


def compare(off: dict[str, Any], on: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measure found in both runs, in the off run's order."""
    before, after = measures(off), measures(on)
    return [
        {"measure": name, "off": value, "on": after[name], "on_over_off": after[name] / value}
        for name, value in before.items()
        if name in after and value
    ]


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'measure':<28} {'off':>12} {'on':>12} {'on/off':>8}"]
    for row in rows:
        lines.append(
            f"{row['measure']:<28} {row['off']:>12.2f} {row['on']:>12.2f} "
            f"{row['on_over_off']:>8.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("off", type=Path, help="throughput JSON with --no-cuda-fast-paths")
    parser.add_argument("on", type=Path, help="throughput JSON with --cuda-fast-paths")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    off, on = (json.loads(path.read_text()) for path in (args.off, args.on))
    rows = compare(off, on)
    print(format_table(rows))
    chosen = on.get("skinny_matmul", {})
    if chosen:
        print("\nskinny matmul choices (on):")
        for shape, kernel in chosen.items():
            print(f"  {shape}: {kernel}")
    # Both reports whole: the one JSON that comes back from the device holds every number.
    result = {"rows": rows, "skinny_matmul": chosen, "off_report": off, "on_report": on}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
