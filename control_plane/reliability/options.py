"""How the control plane survives lost workers and overload: one validated config object.

Its fields declare their CLI flags (``--migration-limit``, ``--heartbeat-interval``,
``--heartbeat-timeout``, ``--engine-stall-timeout``, ``--max-in-flight``,
``--max-queued-prefill-tokens``, ``--admission-wait``; see ``control_plane.flags``); the
service (migration, admission) and the cluster runtime (actor health) read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynask.control_plane.flags import flag, limit, non_negative_float, non_negative_int, seconds

DEFAULT_MAX_IN_FLIGHT = 4096
DEFAULT_MAX_QUEUED_PREFILL_TOKENS = 2**21  # ~2M prompt tokens waiting for their first token
DEFAULT_ADMISSION_WAIT_S = 10.0


@dataclass(frozen=True)
class ReliabilityOptions:
    """Limits and timings of migration, failure detection and load shedding."""

    migration_limit: int = flag(  # times one request may move to another actor
        "--migration-limit",
        3,
        "times one request may move to another engine when its own is lost "
        "(default {default}; 0: never move)",
        type=non_negative_int,
    )
    migration_wait_s: float = 30.0  # how long a moving request waits for a ready actor
    heartbeat_interval_s: float = flag(  # between two health calls to one actor
        "--heartbeat-interval",
        1.0,
        "seconds between health calls to each engine actor (default {default:g})",
        type=seconds,
    )
    heartbeat_timeout_s: float = flag(  # no answer for this long: the actor is lost
        "--heartbeat-timeout",
        10.0,
        "an engine actor silent this long is lost: its requests move (default {default:g})",
        type=seconds,
    )
    engine_stall_timeout_s: float = flag(  # work waiting, no engine step this long: lost
        "--engine-stall-timeout",
        120.0,
        "an engine with requests but no step for this long is lost, though its "
        "worker answers (default {default:g}; longer than your slowest step)",
        type=seconds,
    )
    max_in_flight: int | None = flag(  # None: no limit
        "--max-in-flight",
        DEFAULT_MAX_IN_FLIGHT,
        "503 beyond this many requests in flight (default {default}; 'none': no limit)",
        type=limit,
    )
    max_queued_prefill_tokens: int | None = flag(  # None: no limit
        "--max-queued-prefill-tokens",
        DEFAULT_MAX_QUEUED_PREFILL_TOKENS,
        "503 beyond this many prompt tokens waiting for their first token (default "
        "{default}; 'none': no limit)",
        type=limit,
    )
    admission_wait_s: float = flag(  # at an admission limit: how long a request waits its turn
        "--admission-wait",
        DEFAULT_ADMISSION_WAIT_S,
        "at --max-in-flight or --max-queued-prefill-tokens, a request waits this long for "
        "room, in weighted fair order of priority classes and tenants, before its 503 "
        "(default {default:g}; 0: at once)",
        type=non_negative_float,
    )

    def __post_init__(self) -> None:
        _check_int("migration_limit", self.migration_limit, minimum=0)
        for name in (
            "migration_wait_s",
            "heartbeat_interval_s",
            "heartbeat_timeout_s",
            "engine_stall_timeout_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(
                    f"ReliabilityOptions.{name} has value {value!r}; expected a number > 0"
                )
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"ReliabilityOptions.heartbeat_timeout_s ({self.heartbeat_timeout_s!r}) must be "
                f"longer than heartbeat_interval_s ({self.heartbeat_interval_s!r})"
            )
        wait = self.admission_wait_s
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < 1e9:
            raise ValueError(
                f"ReliabilityOptions.admission_wait_s has value {wait!r}; expected a number >= 0"
            )
        for name in ("max_in_flight", "max_queued_prefill_tokens"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, minimum=1)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"ReliabilityOptions.{name} has value {value!r}; expected an integer >= {minimum}"
        )
