"""How the control plane survives lost workers and overload: one validated config object.

The CLI flags (``--migration-limit``, ``--heartbeat-interval``, ``--heartbeat-timeout``,
``--max-in-flight``, ``--max-queued-prefill-tokens``) land here; the service (migration,
admission) and the cluster runtime (actor health) read it.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_IN_FLIGHT = 4096
DEFAULT_MAX_QUEUED_PREFILL_TOKENS = 2**21  # ~2M prompt tokens waiting for their first token


@dataclass(frozen=True)
class ReliabilityOptions:
    """Limits and timings of migration, failure detection and load shedding."""

    migration_limit: int = 3  # times one request may move to another actor
    migration_wait_s: float = 30.0  # how long a moving request waits for a ready actor
    heartbeat_interval_s: float = 1.0  # between two health calls to one actor
    heartbeat_timeout_s: float = 10.0  # no answer for this long: the actor is lost
    engine_stall_timeout_s: float = 120.0  # work waiting, no engine step this long: lost
    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT  # None: no limit
    max_queued_prefill_tokens: int | None = DEFAULT_MAX_QUEUED_PREFILL_TOKENS  # None: no limit

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
        for name in ("max_in_flight", "max_queued_prefill_tokens"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, minimum=1)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"ReliabilityOptions.{name} has value {value!r}; expected an integer >= {minimum}"
        )
