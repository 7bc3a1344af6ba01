"""The planner's decision: observed latencies and load -> replica counts, with a reason.

A pure function of what was observed (``DeploymentLoad`` per deployment), the targets
and budget (``PlannerConfig``) and the time since the last change settled; the async
loop around it is ``planner_loop``.

Design decisions:
- Each role answers for one target: a prefill deployment for TTFT, a decode deployment
  for ITL, an aggregated one for both (the worse ratio counts). A KV cache nearly full
  counts as a miss: the next requests would wait or be preempted.
- Load is predicted one window ahead by the linear trend of the request rate (this
  window's rate plus its change since the previous window). Scaling up starts when a
  p90 passes ``scale_up_at`` of its target (headroom: a p90 at the target still leaves
  10% of requests over it) and sizes for the predicted load, assuming latency grows in
  proportion to load per replica: ``ceil(replicas * ratio / scale_up_at * growth)``, at
  most ``max_step`` more at a time.
- Scaling down is cautious: one replica at a time, only when the rate is not rising and
  the latency projected on one replica fewer (the same proportional model, which
  overestimates when a fixed step cost dominates) stays under ``scale_down_margin`` of
  the target. No requests at all for a whole window also scales down by one.
- Never below ``min_replicas``, never above the budget (``max_workers`` replicas in all,
  the busiest deployment served first); no decision while an actor is still starting,
  nor before one whole window of metrics has been seen since the last change settled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dynask.control_plane.flags import flag
from dynask.control_plane.serving.latency_window import LatencySummary
from dynask.control_plane.state.deployment import Role

KV_USAGE_LIMIT = 0.9


@dataclass(frozen=True)
class PlannerConfig:
    """Targets, bounds and pacing of the planner; validated on construction."""

    dry_run: bool = flag(
        "--planner-dry-run",
        False,
        "with --planner: only log what it would do (planner.would_scale events)",
        action="store_true",
    )
    ttft_target_ms: float = flag(
        "--ttft-target-ms",
        500.0,
        "90th-percentile time to first token to keep (default {default:g})",
        type=float,
    )
    itl_target_ms: float = flag(
        "--itl-target-ms",
        50.0,
        "90th-percentile inter-token latency to keep (default {default:g})",
        type=float,
    )
    interval_s: float = flag(
        "--planner-interval", 5.0, "seconds between decisions (default {default:g})", type=float
    )
    window_s: float = flag(  # requests of this many seconds make one observation
        "--planner-window",
        10.0,
        "seconds of recent requests per observation (default {default:g})",
        type=float,
    )
    min_replicas: int = flag(
        "--planner-min-replicas",
        1,
        "never fewer replicas per deployment (default {default})",
        type=int,
    )
    max_workers: int = flag(  # the budget: replicas of all planned deployments together
        "--planner-max-workers",
        8,
        "the budget: replicas of all deployments together, and the most workers an "
        "embedded cluster grows to (default {default})",
        type=int,
    )
    scale_up_at: float = 0.8  # of the target: headroom, as the targets are p90s
    scale_down_margin: float = 0.6
    max_step: int = 2

    def __post_init__(self) -> None:
        for name in ("ttft_target_ms", "itl_target_ms", "interval_s", "window_s"):
            _check(getattr(self, name) > 0, name, getattr(self, name), "a number > 0")
        _check(self.min_replicas >= 0, "min_replicas", self.min_replicas, "an integer >= 0")
        _check(
            self.max_workers >= max(1, self.min_replicas),
            "max_workers",
            self.max_workers,
            f"an integer >= max(1, min_replicas={self.min_replicas})",
        )
        _check(0 < self.scale_up_at <= 1, "scale_up_at", self.scale_up_at, "a number in (0, 1]")
        _check(
            0 < self.scale_down_margin < self.scale_up_at,
            "scale_down_margin",
            self.scale_down_margin,
            f"a number in (0, scale_up_at={self.scale_up_at:g})",
        )
        _check(self.max_step >= 1, "max_step", self.max_step, "an integer >= 1")


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"PlannerConfig '{name}' has value {value!r}; expected {expected}")


@dataclass(frozen=True)
class DeploymentLoad:
    """What the planner saw of one deployment over the last window."""

    name: str
    role: Role
    replicas: int  # desired
    ready: int
    latency: LatencySummary
    previous_rate: float | None = None  # request rate of the window before; None: unknown
    kv_usage: float = 0.0  # the fullest ready actor's


@dataclass(frozen=True)
class PlanDecision:
    """New replica counts (only those that change) and why; ``hold`` says why none."""

    replicas: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    hold: str = ""


def decide(
    config: PlannerConfig, loads: list[DeploymentLoad], settled_for_s: float | None
) -> PlanDecision:
    """The replica counts the planner wants; ``settled_for_s`` is the time since every
    actor of the last change became ready (None: no change yet)."""
    starting = [f"{d.name} ({d.ready}/{d.replicas} ready)" for d in loads if d.ready < d.replicas]
    if starting:
        return PlanDecision(hold="waiting for actors to become ready: " + ", ".join(starting))
    if settled_for_s is not None and settled_for_s < config.window_s:
        return PlanDecision(
            hold=f"waiting for {config.window_s:g}s of metrics since the last change "
            f"({settled_for_s:.1f}s so far)"
        )
    wanted: dict[str, int] = {}
    reasons: dict[str, str] = {}
    pressure: dict[str, float] = {}
    for load in loads:
        count, reason, ratio = _wanted(config, load)
        wanted[load.name], reasons[load.name], pressure[load.name] = count, reason, ratio
    _fit_budget(config, loads, wanted, reasons, pressure)
    changed = {d.name: wanted[d.name] for d in loads if wanted[d.name] != d.replicas}
    if not changed:
        summary = "; ".join(f"{d.name}: {reasons[d.name]}" for d in loads)
        return PlanDecision(hold=summary or "no deployments to plan")
    return PlanDecision(changed, {name: reasons[name] for name in changed})


def _wanted(config: PlannerConfig, load: DeploymentLoad) -> tuple[int, str, float]:
    """(replicas, reason, ratio of observed to target latency) for one deployment."""
    n, floor = load.replicas, config.min_replicas
    if load.latency.requests == 0:
        if n > floor:
            return n - 1, f"no requests in the last {config.window_s:g}s: {n} -> {n - 1}", 0.0
        return n, "no requests", 0.0
    ratio, measured = _latency_ratio(config, load)
    if load.kv_usage >= KV_USAGE_LIMIT:
        ratio = max(ratio, config.scale_up_at + 1e-9)
        measured += f", KV cache {load.kv_usage:.0%} full"
    rate = load.latency.request_rate
    growth = _growth(rate, load.previous_rate)
    load_text = f"{rate:.2f} req/s (predicted {rate * growth:.2f})"
    if ratio > config.scale_up_at or n < max(floor, 1):
        pressed = ratio > config.scale_up_at
        target = math.ceil(max(n, 1) * ratio / config.scale_up_at * growth) if pressed else 1
        count = min(max(target, n + 1), n + config.max_step)
        return count, f"{measured} at {load_text}: {n} -> {count}", ratio
    if n > floor and n > 1 and growth <= 1.0:
        projected = ratio * n / (n - 1)
        if projected < config.scale_down_margin:
            return (
                n - 1,
                f"{measured} at {load_text}; projected {projected:.0%} of target on "
                f"{n - 1}: {n} -> {n - 1}",
                ratio,
            )
    return n, f"{measured} at {load_text}: keep {n}", ratio


def _latency_ratio(config: PlannerConfig, load: DeploymentLoad) -> tuple[float, str]:
    """The worst observed/target ratio of the role's targets, and its description."""
    parts: list[tuple[float, str]] = []
    ttft, itl = load.latency.ttft_p90_s, load.latency.itl_p90_s
    if load.role != Role.DECODE and ttft is not None:
        target = config.ttft_target_ms
        parts.append((ttft * 1000 / target, f"TTFT p90 {ttft * 1000:.0f} ms (target {target:g})"))
    if load.role != Role.PREFILL and itl is not None:
        target = config.itl_target_ms
        parts.append((itl * 1000 / target, f"ITL p90 {itl * 1000:.1f} ms (target {target:g})"))
    if not parts:
        return 0.0, "no latency samples"
    return max(parts)


def _growth(rate: float, previous: float | None) -> float:
    """Predicted rate / current rate, one window ahead on the linear trend (>= 0)."""
    if previous is None or rate <= 0:
        return 1.0
    return max(0.0, 2.0 - previous / rate)


def _fit_budget(
    config: PlannerConfig,
    loads: list[DeploymentLoad],
    wanted: dict[str, int],
    reasons: dict[str, str],
    pressure: dict[str, float],
) -> None:
    """Trims growth to the budget, least pressed deployments first."""
    excess = sum(wanted.values()) - config.max_workers
    for load in sorted(loads, key=lambda d: pressure[d.name]):
        if excess <= 0:
            return
        grown = wanted[load.name] - load.replicas
        cut = min(excess, max(0, grown), max(0, wanted[load.name] - config.min_replicas))
        if cut:
            wanted[load.name] -= cut
            excess -= cut
            reasons[load.name] += f" (trimmed to {wanted[load.name]}: budget of "
            reasons[load.name] += f"{config.max_workers} workers)"
