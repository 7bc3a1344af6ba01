"""The command-line flags of the planner (autoscaling of prefill/decode deployments)."""

from __future__ import annotations

import argparse

from dynask.control_plane.planner.decision import PlannerConfig


def add_planner_args(cmd: argparse.ArgumentParser) -> None:
    group = cmd.add_argument_group("planner (scales deployments to latency targets)")
    group.add_argument(
        "--planner", action="store_true", help="scale deployments to the targets (default off)"
    )
    group.add_argument(
        "--planner-dry-run",
        action="store_true",
        help="with --planner: only log what it would do (planner.would_scale events)",
    )
    defaults = PlannerConfig()
    group.add_argument(
        "--ttft-target-ms",
        type=float,
        default=defaults.ttft_target_ms,
        help=f"90th-percentile time to first token to keep (default {defaults.ttft_target_ms:g})",
    )
    group.add_argument(
        "--itl-target-ms",
        type=float,
        default=defaults.itl_target_ms,
        help=f"90th-percentile inter-token latency to keep (default {defaults.itl_target_ms:g})",
    )
    group.add_argument(
        "--planner-interval",
        type=float,
        default=defaults.interval_s,
        help=f"seconds between decisions (default {defaults.interval_s:g})",
    )
    group.add_argument(
        "--planner-window",
        type=float,
        default=defaults.window_s,
        help=f"seconds of recent requests per observation (default {defaults.window_s:g})",
    )
    group.add_argument(
        "--planner-min-replicas",
        type=int,
        default=defaults.min_replicas,
        help=f"never fewer replicas per deployment (default {defaults.min_replicas})",
    )
    group.add_argument(
        "--planner-max-workers",
        type=int,
        default=defaults.max_workers,
        help="the budget: replicas of all deployments together, and the most workers an "
        f"embedded cluster grows to (default {defaults.max_workers})",
    )


def planner_config(args: argparse.Namespace) -> PlannerConfig | None:
    """The planner's config, or None when ``--planner`` is off (ValueError names a bad
    flag's value)."""
    if getattr(args, "planner_dry_run", False) and not args.planner:
        raise ValueError("--planner-dry-run needs --planner")
    if not getattr(args, "planner", False):
        return None
    return PlannerConfig(
        ttft_target_ms=args.ttft_target_ms,
        itl_target_ms=args.itl_target_ms,
        min_replicas=args.planner_min_replicas,
        max_workers=args.planner_max_workers,
        interval_s=args.planner_interval,
        window_s=args.planner_window,
        dry_run=args.planner_dry_run,
    )
