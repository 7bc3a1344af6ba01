"""An experiment for ``router_sim``: requests held in the router while every engine is busy.

The product does not do this. ``RouterQueueSimulation`` measures what reordering the
queued requests could buy over routing alone (``router_sim --router-queue``,
``router_sim_p99``'s "requests held in the router"); the engines still run their own
queues first come, first served.
"""

from __future__ import annotations

from typing import Any

from bench.routing.router_sim import Simulation
from bench.routing.sim_engine import SimSequence


class RouterQueueSimulation(Simulation):
    """An experiment the product does not have: the router holds requests back while every
    actor has more than ``threshold_blocks`` of prefill queued, then sends the shortest
    first (fewest blocks uncached on the best-placed actor), or the oldest once one has
    waited ``max_wait_ms``. It measures what reordering could buy over routing alone: the
    engines run their queues first come, first served."""

    def __init__(
        self,
        *args: Any,
        threshold_blocks: int = 64,
        max_wait_ms: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.threshold_blocks = threshold_blocks
        self.max_wait_ms = max_wait_ms
        self.held: list[SimSequence] = []

    def _arrive(self, seq: SimSequence) -> None:
        self.held.append(seq)
        self._release()

    def _step_end(self, index: int, chunks: list[tuple[SimSequence, int]]) -> None:
        super()._step_end(index, chunks)
        self._release()

    def _release(self) -> None:
        while self.held and any(
            sum(view.prefill_blocks.values()) <= self.threshold_blocks for view in self.views
        ):
            overdue = [
                seq
                for seq in self.held
                if self.max_wait_ms is not None and self.now_ms - seq.arrival_ms > self.max_wait_ms
            ]
            seq = overdue[0] if overdue else min(self.held, key=self._uncached_at_best)
            self.held.remove(seq)
            super()._arrive(seq)

    def _uncached_at_best(self, seq: SimSequence) -> int:
        overlaps = self.overlaps(seq, approximate=False).values()
        return len(seq.keys) - max((overlap.total_blocks for overlap in overlaps), default=0)
