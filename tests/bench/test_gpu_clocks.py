"""bench.engine.gpu_clocks: nvidia-smi's CSV lines and the per-phase summary."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from bench.engine import gpu_clocks
from bench.engine.gpu_clocks import (
    REASONS,
    ClockLog,
    Sample,
    clock_table,
    load,
    parse_line,
    phases_path,
    summarize,
)


def _at(text: str) -> float:
    return datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f").timestamp()


def test_parse_line_reads_numbers_and_active_reasons() -> None:
    line = "2026/12/05 20:01:02.250, 1755, 1980, 688.41, 700.00, 61, Active, Not Active, Not Active"
    sample = parse_line(line, REASONS)
    assert sample == Sample(
        at=_at("2026/12/05 20:01:02.250"), sm_mhz=1755.0, max_sm_mhz=1980.0, power_w=688.41,
        power_limit_w=700.0, temperature_c=61.0, reasons=("sw_power_cap",),
    )  # fmt: skip
    no_reasons = parse_line("2026/12/05 20:01:02.250, 1980, 1980, 90.5, 700.00, 35", ())
    assert no_reasons is not None and no_reasons.reasons == () and no_reasons.power_w == 90.5


def test_parse_line_refuses_what_it_cannot_read() -> None:
    assert parse_line("timestamp, clocks.sm [MHz]", REASONS) is None
    assert parse_line("2026/12/05 20:01:02.250, [N/A], 1980, 1, 2, 3", ()) is None


def test_summarize_cuts_samples_into_phases() -> None:
    base = _at("2026/12/05 20:00:00.000")

    def sample(dt: float, mhz: float, watts: float, *reasons: str) -> Sample:
        return Sample(base + dt, mhz, 1980.0, watts, 700.0, 50.0 + dt, tuple(reasons))

    samples = [
        sample(0.1, 1980, 100),
        sample(0.5, 1980, 120),
        sample(1.1, 1800, 690, "sw_power_cap"),
        sample(1.3, 1700, 700, "sw_power_cap"),
        sample(1.5, 1760, 650),
    ]
    phases = [("idle", base, base + 1.0), ("busy", base + 1.0, base + 1.6)]
    rows = summarize(samples, [*phases, ("none", base + 2.0, base + 3.0)])
    assert rows[0] == {
        "phase": "idle",
        "seconds": 1.0,
        "samples": 2,
        "sm_mhz_mean": 1980.0,
        "sm_mhz_min": 1980.0,
        "sm_mhz_peak": 1980.0,
        "max_sm_mhz": 1980.0,
        "power_w_mean": 110.0,
        "power_limit_w": 700.0,
        "temperature_c_max": 50.5,
        "reason_share": {},
    }
    assert rows[1]["sm_mhz_mean"] == 1753.3 and rows[1]["sm_mhz_min"] == 1700.0
    assert rows[1]["sm_mhz_peak"] == 1800.0
    assert rows[1]["power_w_mean"] == 680.0
    assert rows[1]["reason_share"] == {"sw_power_cap": 0.667}
    assert rows[2] == {"phase": "none", "seconds": 1.0, "samples": 0}
    text = clock_table(rows)
    assert "1753/1700 (1980)" in text and "sw_power_cap 67%" in text and "(no samples)" in text


def test_clock_log_marks_phases_without_a_gpu(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: phases, no samples
    with ClockLog(tmp_path / "smi.csv") as log:
        log.mark("a")
        log.mark("b")
    assert [name for name, _, _ in log.phases] == ["a", "b"]
    assert all(start <= end for _, start, end in log.phases)
    assert [row["samples"] for row in log.summary()] == [0, 0]


def test_a_run_that_raised_is_summarised_from_its_files(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    samples = tmp_path / "run.smi.csv"
    idle, capped = "Not Active, Not Active, Not Active", "Active, Not Active, Not Active"
    samples.write_text(
        f"2026/12/05 20:00:00.100, 1980, 1980, 100.0, 700.00, 40, {idle}\n"
        f"2026/12/05 20:00:01.100, 1400, 1980, 700.0, 700.00, 60, {capped}\n"
        f"2026/12/05 20:00:01.300, 1420, 1980, 690.0, 700.00, 61, {capped}\n"
    )
    base = _at("2026/12/05 20:00:00.000")
    phases = [["idle", base, base + 1.0], ["sustained", base + 1.0, base + 2.0]]
    phases_path(samples).write_text(json.dumps({"reasons": list(REASONS), "phases": phases}))
    rows = load(samples)
    assert [(r["phase"], r["samples"], r.get("sm_mhz_mean")) for r in rows] == [
        ("idle", 1, 1980.0),
        ("sustained", 2, 1410.0),
    ]
    assert rows[1]["reason_share"] == {"sw_power_cap": 1.0}
    gpu_clocks.main([str(samples)])
    out = capsys.readouterr().out
    assert "1410/1400 (1980)" in out and "sw_power_cap 100%" in out
