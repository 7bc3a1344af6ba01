"""The report of ``serve.py``: result rows, the goals, the table and the JSON file.

Goals from the issue, as booleans (``None`` when the scenario did not run): at 64
concurrent streams against the mocker, at most 2 ms of control-plane CPU per request;
at 1 client against the torch engine, TTFT p50 at most 10 ms above the engine's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.common.load import LoadSummary

GOAL_CPU_MS_AT_64 = 2.0
GOAL_TTFT_OVERHEAD_MS = 10.0


@dataclass(frozen=True)
class Row:
    """One measured window: a system, an engine, a concurrency."""

    system: str
    engine: str
    concurrency: int
    load: LoadSummary
    cp_cpu_ms_per_req: float | None  # the control plane (dynask serve / Dynamo frontend)
    engine_cpu_ms_per_req: float | None  # the engine's process group
    client_cpu_ms_per_req: float | None  # this process: the load generator
    load_avg_1m: float


@dataclass(frozen=True)
class EngineTTFT:
    """The built-in engine's TTFT in this process, without HTTP or Dask in between."""

    prompt_tokens: int
    torch_threads: int
    trials: int
    p50_ms: float
    all_ms: list[float]


def find_row(rows: list[Row], system: str, engine: str, concurrency: int) -> Row | None:
    return next(
        (r for r in rows if (r.system, r.engine, r.concurrency) == (system, engine, concurrency)),
        None,
    )


def ttft_overhead_ms(rows: list[Row], engine_ttft: EngineTTFT | None) -> float | None:
    row = find_row(rows, "dynask", "torch", 1)
    if row is None or engine_ttft is None or row.load.ttft_p50_ms is None:
        return None
    return row.load.ttft_p50_ms - engine_ttft.p50_ms


def evaluate_goals(rows: list[Row], engine_ttft: EngineTTFT | None) -> dict[str, bool | None]:
    row = find_row(rows, "dynask", "mocker", 64)
    cpu = row.cp_cpu_ms_per_req if row else None
    overhead = ttft_overhead_ms(rows, engine_ttft)
    return {
        "mocker_c64_cp_cpu_ms_per_req_le_2": None if cpu is None else cpu <= GOAL_CPU_MS_AT_64,
        # negative: the two TTFTs differ by noise only, which proves nothing either way
        "torch_c1_ttft_overhead_ms_le_10": (
            None if overhead is None or overhead < 0 else overhead <= GOAL_TTFT_OVERHEAD_MS
        ),
    }


HEADER = (
    f"{'system':<7} {'engine':<6} {'conc':>4} {'ok':>5} {'fail':>4} {'req/s':>7} "
    f"{'out tok/s':>9} {'TTFT p50':>8} {'TTFT p99':>8} {'ITL p50':>7} {'ITL p99':>7} "
    f"{'tok/chk':>7} {'CP ms/req':>9} {'eng ms/req':>10} {'cli ms/req':>10} {'load1':>5}"
)


def _num(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def format_row(row: Row) -> str:
    load = row.load
    return (
        f"{row.system:<7} {row.engine:<6} {row.concurrency:>4} {load.requests_ok:>5} "
        f"{load.requests_failed:>4} {load.req_per_s:>7.1f} {load.output_tok_per_s:>9.0f} "
        f"{_num(load.ttft_p50_ms, 8)} {_num(load.ttft_p99_ms, 8)} "
        f"{_num(load.itl_p50_ms, 7, 2)} {_num(load.itl_p99_ms, 7, 2)} "
        f"{_num(load.tokens_per_chunk, 7, 2)} {_num(row.cp_cpu_ms_per_req, 9, 2)} "
        f"{_num(row.engine_cpu_ms_per_req, 10, 2)} {_num(row.client_cpu_ms_per_req, 10, 2)} "
        f"{row.load_avg_1m:>5.2f}"
    )


def format_table(
    rows: list[Row],
    engine_ttft: EngineTTFT | None,
    goals: dict[str, bool | None],
    idle: dict[str, float],
    prompt_tokens: int,
    max_tokens: int,
) -> str:
    lines = [
        f"Closed-loop streaming /v1/completions: ~{prompt_tokens}-token prompts, "
        f"{max_tokens} output tokens; times in ms; CPU in ms per completed request",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    for row in rows:
        if row.load.failures:
            lines.append(f"failures {row.system}/{row.engine}/c{row.concurrency}: ")
            lines[-1] += ", ".join(f"{n}x {why}" for why, n in row.load.failures.items())
    if idle:
        lines.append(
            "control plane idle CPU (ms/s): "
            + ", ".join(f"{name} {ms:.1f}" for name, ms in idle.items())
        )
    if engine_ttft is not None:
        lines += _ttft_lines(rows, engine_ttft)
    lines += [f"goal {name}: {value}" for name, value in goals.items()]
    return "\n".join(lines)


def _ttft_lines(rows: list[Row], engine_ttft: EngineTTFT) -> list[str]:
    overhead = ttft_overhead_ms(rows, engine_ttft)
    lines = [
        f"torch engine TTFT in-process ({engine_ttft.prompt_tokens}-token prompt, "
        f"{engine_ttft.torch_threads} torch thread, median of {engine_ttft.trials}): "
        f"{engine_ttft.p50_ms:.1f} ms; control-plane TTFT overhead at 1 client "
        f"(HTTP TTFT p50 - engine TTFT p50): {_num(overhead, 0)} ms"
    ]
    if overhead is not None and overhead < 0:
        lines.append(
            "  note: negative, so the engine ran slower in this process than in the worker "
            "(machine noise); the overhead is within the noise, so the goal is null"
        )
    return lines
