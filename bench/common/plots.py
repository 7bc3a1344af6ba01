"""PNG plots of benchmark results, written beside their JSON (``engine.json`` ->
``engine.png``).

- ``engine.py``: output tokens/s against batch size, ours and HF transformers, and the
  TTFT of a long prompt cold and with its prefix cached.
- ``routing.py``: the routing modes side by side per scenario: TTFT p50/p99, KV hit rate,
  requests/s.
- ``routing/trace_replay.py``: every target (system and router mode) side by side: TTFT
  mean and p99, the engines' KV hit rate against the trace's reusable share, E2E p50.
- ``serve.py``: TTFT and ITL percentiles (p50, p99) against concurrency, per system
  and engine: the latency distributions as the benchmark records them.

    .venv/bin/python -m bench.common.plots               # engine, routing and serve results
    .venv/bin/python -m bench.common.plots bench/results/routing.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parents[1] / "results"


def engine_figure(data: dict[str, Any]) -> Figure:
    rows = data["throughput"]
    batches = [str(r["batch"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(rows))
    left.bar([i - 0.2 for i in x], [r["ours_tok_s"] for r in rows], 0.4, label="dynask")
    hf = [r.get("hf_tok_s") or 0 for r in rows]
    left.bar([i + 0.2 for i in x], hf, 0.4, label="HF transformers")
    left.set_xticks(list(x), batches)
    left.set(xlabel="batch size", ylabel="output tokens/s", title="Throughput vs batch")
    left.legend()
    ttft = data.get("ttft") or {}
    if ttft:
        right.bar(["cold", "prefix cached"], [ttft["cold_ms"], ttft["cached_ms"]])
        right.set(
            ylabel="ms", title=f"TTFT, {ttft['prompt_len']}-token prompt (x{ttft['speedup']:.1f})"
        )
    fig.suptitle(f"bench/engine.py, {data.get('timestamp', '')}")
    fig.tight_layout()
    return fig


def routing_figure(data: dict[str, Any]) -> Figure:
    rows = data["rows"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    panels = [
        ("ttft_p50_ms", "TTFT p50 (ms)"),
        ("ttft_p99_ms", "TTFT p99 (ms)"),
        ("kv_hit_rate", "KV hit rate"),
        ("req_per_s", "requests/s"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    width = 0.8 / len(modes)
    for ax, (key, label) in zip(axes, panels, strict=True):
        for m, mode in enumerate(modes):
            values = [
                next((r.get(key) or 0 for r in rows if r["scenario"] == s and r["mode"] == mode), 0)
                for s in scenarios
            ]
            ax.bar([i + (m - (len(modes) - 1) / 2) * width for i in range(len(scenarios))], values,
                   width, label=mode)  # fmt: skip
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title(label)
    axes[0].legend()
    fig.suptitle(f"bench/routing.py: routing modes side by side, {data.get('timestamp', '')}")
    fig.tight_layout()
    return fig


def serve_figure(data: dict[str, Any]) -> Figure:
    rows = data["rows"]
    fig, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(f"{row['system']} {row['engine']}", []).append(row)
    for name, items in series.items():
        items.sort(key=lambda r: r["concurrency"])
        conc = [r["concurrency"] for r in items]
        for ax, metric in ((ttft_ax, "ttft"), (itl_ax, "itl")):
            for pct, style in (("p50", "-o"), ("p99", "--o")):
                values = [r["load"].get(f"{metric}_{pct}_ms") for r in items]
                if any(v is not None for v in values):
                    ax.plot(conc, values, style, label=f"{name} {pct}")
    for ax, title in ((ttft_ax, "TTFT"), (itl_ax, "Inter-token latency")):
        ax.set(xlabel="concurrent streams", ylabel="ms", title=title, xscale="log", yscale="log")
    itl_ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"bench/serve.py: latency distribution, {data.get('timestamp', '')}")
    fig.tight_layout()
    return fig


def trace_figure(data: dict[str, Any]) -> Figure:
    rows = data["trace_rows"]
    names = [f"{r['system']}\n{r['mode']}" for r in rows]
    panels = [
        ("ttft_ms", "mean", "TTFT mean (ms)"),
        ("ttft_ms", "p99", "TTFT p99 (ms)"),
        ("kv_hit_rate", None, "KV hit rate (engines)"),
        ("e2e_ms", "p50", "E2E p50 (ms)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2))
    colors = ["tab:blue" if r["system"] == "dynask" else "tab:green" for r in rows]
    for ax, (key, stat, label) in zip(axes, panels, strict=True):
        values = [(r[key] or {}).get(stat) if stat else r[key] for r in rows]
        ax.bar(range(len(rows)), [v or 0 for v in values], color=colors)
        ax.set_xticks(range(len(rows)), names, fontsize=7)
        ax.set_title(label)
    share = data["reusable_share"]["tokens_engine_blocks"]
    axes[2].axhline(share, color="black", linestyle="--", label=f"trace reusable {share:.2f}")
    axes[2].legend(fontsize=8)
    fig.suptitle(
        f"trace_replay: slice {data['slice']} x{data['speedup']:g}, {data['actors']} mockers "
        f"each (blue dynask, green Dynamo 1.6.1), {data.get('timestamp', '')}"
    )
    fig.tight_layout()
    return fig


def tracing_figure(data: dict[str, Any]) -> Figure:
    rows = data["tracing_rows"]
    panels = [
        ("req_per_s", "requests/s"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
        ("ttft_p99_ms", "TTFT p99 (ms)"),
        ("cp_cpu_ms_per_req", "control-plane CPU ms / request"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    rounds = sorted({r["round"] for r in rows})
    for ax, (key, label) in zip(axes, panels, strict=True):
        for offset, mode in ((-0.2, "off"), (0.2, "on")):
            values = [
                next((r.get(key) or 0 for r in rows if r["round"] == n and r["mode"] == mode), 0)
                for n in rounds
            ]
            ax.bar([i + offset for i in range(len(rounds))], values, 0.4, label=f"tracing {mode}")
        ax.set_xticks(range(len(rounds)), [f"round {n}" for n in rounds])
        ratio = data.get("ratios_on_over_off", {}).get(key)
        ax.set_title(label + (f"  (on/off {ratio:.2f})" if ratio else ""))
    axes[0].legend()
    fig.suptitle(f"bench/serving/tracing.py: tracing off vs on, {data.get('timestamp', '')}")
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "throughput": engine_figure,  # the key that tells a result's kind apart
    "scenarios": routing_figure,
    "trace_rows": trace_figure,
    "engine_ttft": serve_figure,
    "tracing_rows": tracing_figure,
}


# ---- any other result: its tables of numbers, one panel per metric -------------------------

META = {"machine", "config", "code", "code_at_start", "code_at_end", "args", "settings", "argv"}
COUNTS = {"repeats", "requests", "trials", "passes", "rounds", "steps", "all_runs"}  # not metrics
LABEL_KEYS = (
    "batch",
    "rows",
    "concurrency",
    "clients",
    "cap",
    "featured_rows",
    "size_mib",
    "actors",
)
PREFERRED = ("tok_s", "req_per_s", "ttft", "itl", "gbps", "ratio", "hit", "speedup", "_ms", "share")
MAX_TABLES, MAX_METRICS = 3, 4
Rows = list[dict[str, Any]]


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its nested dicts' numbers one level up (``load.ttft_p50_ms``)."""
    flat = {k: v for k, v in row.items() if not isinstance(v, dict)}
    for key, inner in row.items():
        if isinstance(inner, dict):
            flat.update({f"{key}.{k}": v for k, v in inner.items() if _number(v)})
    return flat


def result_tables(data: Any) -> list[tuple[str, Rows]]:
    """The lists of records in a result (top level, or one level down); failing those,
    each section of numbers as a one-row table."""
    sections = data if isinstance(data, dict) else {"rows": data}
    found: list[tuple[str, Rows]] = []
    for key, value in sections.items():
        if key in META:
            continue
        if _is_rows(value):
            found.append((key, [_flat(r) for r in value]))
        elif isinstance(value, dict):
            found += [
                (f"{key}.{k}", [_flat(r) for r in v]) for k, v in value.items() if _is_rows(v)
            ]
    if not found:
        for key, value in sections.items():
            if key not in META and isinstance(value, dict):
                row = _flat(value)
                if any(_number(v) for v in row.values()):
                    found.append((key, [row]))
    return found[:MAX_TABLES]


def row_label(row: dict[str, Any], index: int) -> str:
    parts = [str(v) for k, v in row.items() if isinstance(v, str) and len(v) <= 24]
    parts += [f"{k} {row[k]}" for k in LABEL_KEYS if _number(row.get(k))]
    return " / ".join(parts) or f"#{index}"


def table_metrics(rows: Rows) -> list[str]:
    """Up to ``MAX_METRICS`` numeric columns with data, the latency/throughput ones first."""
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in (*LABEL_KEYS, *COUNTS)]
    numeric = [k for k in keys if any(_number(r.get(k)) and r.get(k) for r in rows)]
    rank = {
        k: next((i for i, p in enumerate(PREFERRED) if p in k), len(PREFERRED)) for k in numeric
    }
    return sorted(numeric, key=lambda k: rank[k])[:MAX_METRICS]


def generic_figure(data: Any, name: str) -> Figure:
    tables = [(t, rows, m) for t, rows in result_tables(data) if (m := table_metrics(rows))]
    if not tables:
        raise ValueError(f"{name}: no table of numbers to draw")
    width = max(len(m) for _, _, m in tables)
    fig, axes = plt.subplots(
        len(tables), width, figsize=(4 * width, 3.6 * len(tables)), squeeze=False
    )
    for line, (table, rows, metrics) in zip(axes, tables, strict=True):
        labels = [row_label(r, i) for i, r in enumerate(rows)]
        for ax, metric in zip(line, metrics, strict=False):
            values = [r.get(metric) if _number(r.get(metric)) else 0 for r in rows]
            ax.barh(range(len(rows)), values)
            ax.set_yticks(range(len(rows)), labels, fontsize=7)
            ax.invert_yaxis()
            ax.set_title(f"{table}: {metric}", fontsize=9)
        for ax in line[len(metrics) :]:
            ax.axis("off")
    when = (
        data.get("timestamp") or data.get("when") or data.get("time") or ""
        if isinstance(data, dict)
        else ""
    )
    fig.suptitle(f"{name} {when}")
    fig.tight_layout()
    return fig


def plot(path: Path) -> Path:
    """Writes the PNG of one result file beside it; returns its path."""
    data = json.loads(path.read_text())
    kind = next((key for key in FIGURES if isinstance(data, dict) and key in data), None)
    figure = FIGURES[kind](data) if kind is not None else generic_figure(data, path.name)
    out = path.with_suffix(".png")
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


if __name__ == "__main__":
    for path in [Path(p) for p in sys.argv[1:]] or sorted(RESULTS.glob("*.json")):
        print(f"wrote {plot(path)}")
