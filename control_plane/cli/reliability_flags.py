"""The command-line flags of migration, failure detection and load shedding."""

from __future__ import annotations

import argparse

from dynask.control_plane.cli.arg_types import non_negative_int
from dynask.control_plane.reliability.options import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_QUEUED_PREFILL_TOKENS,
    ReliabilityOptions,
)

_NO_LIMIT = "none"


def add_reliability_args(cmd: argparse.ArgumentParser) -> None:
    group = cmd.add_argument_group("reliability (lost workers, overload)")
    group.add_argument(
        "--migration-limit",
        type=non_negative_int,
        default=3,
        help="times one request may move to another engine when its own is lost "
        "(default 3; 0: never move)",
    )
    group.add_argument(
        "--heartbeat-interval",
        type=_seconds,
        default=1.0,
        help="seconds between health calls to each engine actor (default 1)",
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=10.0,
        help="an engine actor silent this long is lost: its requests move (default 10)",
    )
    group.add_argument(
        "--engine-stall-timeout",
        type=_seconds,
        default=120.0,
        help="an engine with requests but no step for this long is lost, though its "
        "worker answers (default 120; longer than your slowest step)",
    )
    group.add_argument(
        "--max-in-flight",
        type=_limit,
        default=DEFAULT_MAX_IN_FLIGHT,
        help=f"503 beyond this many requests in flight (default {DEFAULT_MAX_IN_FLIGHT}; "
        "'none': no limit)",
    )
    group.add_argument(
        "--max-queued-prefill-tokens",
        type=_limit,
        default=DEFAULT_MAX_QUEUED_PREFILL_TOKENS,
        help="503 beyond this many prompt tokens waiting for their first token (default "
        f"{DEFAULT_MAX_QUEUED_PREFILL_TOKENS}; 'none': no limit)",
    )


def reliability_options(args: argparse.Namespace) -> ReliabilityOptions:
    """The options from parsed flags; ``ValueError`` (a CLI error) if they contradict."""
    return ReliabilityOptions(
        migration_limit=args.migration_limit,
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        engine_stall_timeout_s=args.engine_stall_timeout,
        max_in_flight=args.max_in_flight,
        max_queued_prefill_tokens=args.max_queued_prefill_tokens,
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected a number of seconds > 0")
    return value


def _limit(text: str) -> int | None:
    if text.lower() == _NO_LIMIT:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"has value {text!r}; expected an integer >= 1 or '{_NO_LIMIT}'"
        )
    return value
