"""Do our mocker and Dynamo's spend the same time on the same steps? (issue 21)

``trace_replay`` gives our mocker Dynamo's timing (``trace_systems.matched_timing``); this
checks the match where it matters for routing: several prompts sharing a step, decodes
beside arriving prompts, many long decodes together. Each case is a small Mooncake-format
trace of unrelated prompts (no prefix hits) replayed by ``trace_replay`` against one
mocker a side, so no router choice enters:

=============  ==========================================================================
``lone4k``     six 4,096-token prompts 3 s apart (one prompt's prefill alone)
``burst8x1k``  eight 1,024-token prompts at once (one step's prefill of several prompts)
``burst4x4k``  four 4,096-token prompts at once (two steps of 8,192 tokens)
``burst16``    sixteen 512-token prompts at once
``mixed``      four 512-token prompts decoding 300 tokens while twenty 4,096-token
               prompts arrive 150 ms apart (decodes in mixed steps)
``decode16``   sixteen 8,192-token prompts decoding 200 tokens together (KV-usage term)
=============  ==========================================================================

    .venv/bin/python -m bench.routing.mocker_timing_check [--cases lone4k,mixed]

Prints TTFT mean, ITL mean and E2E p50 per side and ours over Dynamo's, and writes
``bench/results/mocker_timing_check.json``. Needs the Dynamo peer installed
(``bash ../shared/peers/dynamo/dynamo.sh setup``), as ``trace_replay`` does.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common.report import write_json
from bench.routing import trace_replay
from bench.routing.trace import TRACE_BLOCK_TOKENS

RESULTS = Path(__file__).resolve().parents[1] / "results"
MEASURES = ("ttft_mean_ms", "itl_mean_ms", "e2e_p50_ms")

# case -> groups of (count, prompt blocks of 512 tokens, output tokens, first ms, gap ms)
CASES: dict[str, list[tuple[int, int, int, float, float]]] = {
    "lone4k": [(6, 8, 2, 0, 3000)],
    "burst8x1k": [(8, 2, 2, 0, 0)],
    "burst4x4k": [(4, 8, 2, 0, 0)],
    "burst16": [(16, 1, 2, 0, 0)],
    "mixed": [(4, 1, 300, 0, 0), (20, 8, 2, 200, 150)],
    "decode16": [(16, 16, 200, 0, 0)],
}


def case_lines(groups: list[tuple[int, int, int, float, float]]) -> list[dict[str, Any]]:
    """The trace of a case: every prompt its own hash ids, so no prompt hits another."""
    lines, next_id = [], 1
    for count, blocks, output, first_ms, gap_ms in groups:
        for i in range(count):
            ids = list(range(next_id, next_id + blocks))
            next_id += blocks
            tokens = blocks * TRACE_BLOCK_TOKENS
            lines.append({"timestamp": first_ms + i * gap_ms, "input_length": tokens,
                          "output_length": output, "hash_ids": ids})  # fmt: skip
    return sorted(lines, key=lambda line: line["timestamp"])


def run_case(name: str, workdir: Path) -> dict[str, Any]:
    """One case through ``trace_replay`` (one mocker a side); its rows, by system."""
    trace, out = workdir / f"{name}.jsonl", workdir / f"{name}.json"
    trace.write_text("".join(json.dumps(line) + "\n" for line in case_lines(CASES[name])))
    trace_replay.main(["--trace", str(trace), "--slice", "0:", "--speedup", "1", "--actors", "1",
                       "--targets", "dynask:kv,dynamo:kv", "--out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["trace_rows"]
    return {
        row["system"]: {
            "ok": row["requests_ok"],
            "ttft_mean_ms": row["ttft_ms"]["mean"],
            "itl_mean_ms": row["itl_ms"]["mean"],
            "e2e_p50_ms": row["e2e_ms"]["p50"],
        }
        for row in rows
    }


def ratio_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case, each measure of ours over Dynamo's (None where a side has none)."""
    rows = []
    for name, sides in results.items():
        ours, theirs = sides.get("dynask", {}), sides.get("dynamo", {})
        row: dict[str, Any] = {"case": name}
        for key in MEASURES:
            a, b = ours.get(key), theirs.get(key)
            row[key.removesuffix("_ms") + "_ratio"] = a / b if a and b else None
        rows.append(row)
    return rows


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """Each case's measures, both sides and ``ratio_rows``' ours/Dynamo."""
    lines = [f"{'case':<10} {'measure':<13} {'dynask':>9} {'Dynamo':>9} {'ours/Dynamo':>12}"]
    for (name, sides), ratios in zip(results.items(), ratio_rows(results), strict=True):
        ours, theirs = sides.get("dynask", {}), sides.get("dynamo", {})
        for key in MEASURES:
            value = ratios[key.removesuffix("_ms") + "_ratio"]
            ratio = f"{value:.3f}" if value is not None else "-"
            cells = [
                f"{v:9.1f}" if v is not None else f"{'-':>9}"
                for v in (ours.get(key), theirs.get(key))
            ]
            lines.append(f"{name:<10} {key:<13} {cells[0]} {cells[1]} {ratio:>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="CASE,... of " + ", ".join(CASES))
    parser.add_argument("--out", type=Path, default=RESULTS / "mocker_timing_check.json")
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="mocker-timing-") as tmp:
        results = {name: run_case(name, Path(tmp)) for name in names}
    print("\n" + format_table(results))
    document = {
        "benchmark": "mocker_timing_check",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "cases": {name: CASES[name] for name in names},
        "rows": [{"case": name, "system": system, **measures}
                 for name, sides in results.items() for system, measures in sides.items()],
        "ours_over_dynamo": ratio_rows(results),
    }  # fmt: skip
    write_json(args.out, document)  # and its PNG
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
