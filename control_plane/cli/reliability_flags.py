"""The command-line flags of migration, failure detection and load shedding (declared on
``ReliabilityOptions``' fields)."""

from __future__ import annotations

import argparse

from dynask.control_plane.flags import add_flags, options_from
from dynask.control_plane.reliability.options import ReliabilityOptions


def add_reliability_args(cmd: argparse.ArgumentParser) -> None:
    add_flags(cmd.add_argument_group("reliability (lost workers, overload)"), ReliabilityOptions)


def reliability_options(args: argparse.Namespace) -> ReliabilityOptions:
    """The options from parsed flags; ``ValueError`` (a CLI error) if they contradict."""
    return options_from(args, ReliabilityOptions)
