"""Where a deployment's engine actor failed to start, so the next try goes elsewhere.

On a cluster a model folder may exist on some hosts only, and one worker may lack a
driver or memory the others have. The reconciler notes each failed start per
(deployment, worker): a worker the deployment failed on is tried after the others, and
not again for ``RETRY_AFTER_S`` (a model that fails at once is not reloaded every round).
A changed desired state forgets them all (``clear``): the change may be the fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

RETRY_AFTER_S = 60.0


class FailedStarts:
    """Failed actor starts by (deployment name, worker address), with when they failed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failed: dict[tuple[str, str], float] = {}

    def record(self, deployment: str, worker: str) -> None:
        self._failed[(deployment, worker)] = self._clock()

    def started(self, deployment: str, worker: str) -> None:
        self._failed.pop((deployment, worker), None)

    def clear(self) -> None:
        self._failed.clear()

    def order(self, deployment: str, workers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``workers`` to try for ``deployment``: those it never failed on first (in the
        given order), then those it failed on longest ago; none it failed on within
        ``RETRY_AFTER_S``."""
        now = self._clock()
        fresh, retried = [], []
        for worker in workers:
            failed_at = self._failed.get((deployment, str(worker["address"])))
            if failed_at is None:
                fresh.append(worker)
            elif now - failed_at >= RETRY_AFTER_S:
                retried.append((failed_at, worker))
        return fresh + [worker for _, worker in sorted(retried, key=lambda pair: pair[0])]
