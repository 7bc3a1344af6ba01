"""The GPU's clocks and power while a benchmark runs, summarised per phase.

``nvidia-smi`` samples the SM clock, power draw (instantaneous where the driver has it: its
``power.draw`` is a one-second average) and the active clock-event reasons every
``interval_ms`` in its own process (nothing runs in the benchmark's), and ``summarize``
cuts the samples into the phases the benchmark marked with ``mark`` (wall-clock spans).
A compute-bound phase that runs at a lower SM clock than the short matmul burst the
roofline's rate comes from shows up here as a lower clock with the power cap active.
It samples GPU 0 in ``nvidia-smi``'s numbering: the one-GPU benchmarks' device.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

FIELDS = ("timestamp", "clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu")
REASONS = ("clocks_event_reasons.sw_power_cap", "clocks_event_reasons.hw_slowdown",
           "clocks_event_reasons.sw_thermal_slowdown")  # fmt: skip


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the epoch
    sm_mhz: float
    max_sm_mhz: float
    power_w: float
    power_limit_w: float
    temperature_c: float
    reasons: tuple[str, ...]  # the active ones among REASONS, short names


def parse_line(line: str, reason_names: tuple[str, ...]) -> Sample | None:
    """One CSV line of ``nvidia-smi --format=csv,noheader,nounits``; None if unreadable."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS) + len(reason_names):
        return None
    try:
        at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        sm, max_sm, power, limit, temperature = (float(p) for p in parts[1 : len(FIELDS)])
    except ValueError:
        return None
    active = tuple(
        name.rsplit(".", 1)[-1]
        for name, value in zip(reason_names, parts[len(FIELDS) :], strict=True)
        if value.lower() == "active"
    )
    return Sample(at, sm, max_sm, power, limit, temperature, active)


@dataclass
class ClockLog:
    """``with ClockLog(path) as log:`` samples while the block runs; ``log.mark(name)``
    starts a phase (ending the one before), ``log.summary()`` after the block. Leaving the
    block, even on an error, writes the phases beside the samples (``phases_path``), so
    ``python -m bench.engine.gpu_clocks CSV`` summarises a run that raised."""

    path: Path
    interval_ms: int = 20
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    _open: tuple[str, float] | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _reasons: tuple[str, ...] = REASONS

    def __enter__(self) -> ClockLog:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return self
        probe = subprocess.run(
            [smi, f"--query-gpu={','.join(REASONS)}", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
        )
        self._reasons = REASONS if probe.returncode == 0 else ()  # an older driver
        fields: tuple[str, ...] = FIELDS
        instant = subprocess.run(
            [smi, "--query-gpu=power.draw.instant", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
        )
        if instant.returncode == 0:  # the driver's power.draw is a one-second average
            fields = tuple("power.draw.instant" if f == "power.draw" else f for f in FIELDS)
        query = ",".join(fields + self._reasons)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as out:
            self._proc = subprocess.Popen(
                [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0",
                 f"--loop-ms={self.interval_ms}"],
                stdout=out, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        time.sleep(0.2)
        return self

    def mark(self, name: str | None) -> None:
        now = time.time()
        if self._open is not None:
            self.phases.append((self._open[0], self._open[1], now))
        self._open = None if name is None else (name, now)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.mark(None)
        time.sleep(0.1)
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)
            phases = {"reasons": list(self._reasons), "phases": self.phases}
            phases_path(self.path).write_text(json.dumps(phases, indent=1))

    def samples(self) -> list[Sample]:
        return read_samples(self.path, self._reasons) if self.path.exists() else []

    def summary(self) -> list[dict[str, Any]]:
        return summarize(self.samples(), self.phases)


def phases_path(samples_path: Path) -> Path:
    return samples_path.with_suffix(".phases.json")


def load(samples_path: Path) -> list[dict[str, Any]]:
    """``summarize`` of a run's files: the samples and the phases ``ClockLog`` wrote."""
    saved = json.loads(phases_path(samples_path).read_text())
    samples = read_samples(samples_path, tuple(saved["reasons"]))
    return summarize(samples, [(name, start, end) for name, start, end in saved["phases"]])


def read_samples(path: Path, reason_names: tuple[str, ...]) -> list[Sample]:
    """The readable lines of a samples file (``parse_line``)."""
    lines = path.read_text(errors="replace").splitlines()
    return [s for s in (parse_line(line, reason_names) for line in lines) if s is not None]


def summarize(
    samples: list[Sample], phases: list[tuple[str, float, float]]
) -> list[dict[str, Any]]:
    """Per phase: its samples' mean, lowest and highest SM clock, mean power, and the share
    of samples with each clock-event reason active."""
    rows = []
    for name, start, end in phases:
        inside = [s for s in samples if start <= s.at <= end]
        row: dict[str, Any] = {"phase": name, "seconds": round(end - start, 3),
                               "samples": len(inside)}  # fmt: skip
        if inside:
            count = len(inside)
            row["sm_mhz_mean"] = round(sum(s.sm_mhz for s in inside) / count, 1)
            row["sm_mhz_min"] = min(s.sm_mhz for s in inside)
            row["sm_mhz_peak"] = max(s.sm_mhz for s in inside)
            row["max_sm_mhz"] = inside[0].max_sm_mhz
            row["power_w_mean"] = round(sum(s.power_w for s in inside) / count, 1)
            row["power_limit_w"] = inside[0].power_limit_w
            row["temperature_c_max"] = max(s.temperature_c for s in inside)
            reasons = sorted({r for s in inside for r in s.reasons})
            row["reason_share"] = {
                r: round(sum(r in s.reasons for s in inside) / count, 3) for r in reasons
            }
        rows.append(row)
    return rows


def clock_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'phase':<28} {'s':>6} {'n':>4} {'SM MHz mean/min (max)':>24} "
             f"{'power W (limit)':>16} {'°C':>4}  reasons active (share of samples)"]  # fmt: skip
    for row in rows:
        if not row["samples"]:
            lines.append(f"{row['phase']:<28} {row['seconds']:>6.2f}    0  (no samples)")
            continue
        clocks = f"{row['sm_mhz_mean']:.0f}/{row['sm_mhz_min']:.0f} ({row['max_sm_mhz']:.0f})"
        power = f"{row['power_w_mean']:.0f} ({row['power_limit_w']:.0f})"
        reasons = ", ".join(f"{r} {v:.0%}" for r, v in row["reason_share"].items()) or "-"
        lines.append(
            f"{row['phase']:<28} {row['seconds']:>6.2f} {row['samples']:>4} {clocks:>24} "
            f"{power:>16} {row['temperature_c_max']:>4.0f}  {reasons}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.engine.gpu_clocks SAMPLES.csv``: the table of a run's files."""
    for name in sys.argv[1:] if argv is None else argv:
        print(clock_table(load(Path(name))))


if __name__ == "__main__":
    main()
