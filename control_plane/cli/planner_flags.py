"""The command-line flags of the planner (autoscaling of prefill/decode deployments),
declared on ``PlannerConfig``'s fields; ``--planner`` turns it on."""

from __future__ import annotations

import argparse

from dynask.control_plane.flags import Flag, add_flags, options_from
from dynask.control_plane.planner.decision import PlannerConfig

PLANNER = Flag("--planner", "scale deployments to the targets (default off)", action="store_true")


def add_planner_args(cmd: argparse.ArgumentParser) -> None:
    group = cmd.add_argument_group("planner (scales deployments to latency targets)")
    PLANNER.add_to(group, False)
    add_flags(group, PlannerConfig)


def planner_config(args: argparse.Namespace) -> PlannerConfig | None:
    """The planner's config, or None when ``--planner`` is off (ValueError names a bad
    flag's value)."""
    if getattr(args, "planner_dry_run", False) and not args.planner:
        raise ValueError("--planner-dry-run needs --planner")
    if not getattr(args, PLANNER.dest, False):
        return None
    return options_from(args, PlannerConfig)
