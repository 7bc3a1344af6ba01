"""A weighted fair queue of waiting requests: deficit round robin over priority classes,
round robin over the tenants inside each class.

Design decisions:

- Two levels, as Dynamo's policy-class queues and llm-d's priority bands have them: the
  class picks *how much* of the freed capacity a kind of traffic gets, the tenant level
  picks *who* inside a class goes next. Without the second level one tenant's burst
  would fill its class's share and every other tenant of the class would wait behind it.
- Classes share by deficit round robin (DRR, Shreedhar and Varghese; Linux ``sch_drr``):
  each class with waiters is visited in a ring; a visit adds its weight to its deficit
  and every request taken costs one. Over a busy period class ``c`` gets
  ``weight[c] / sum(weights of busy classes)`` of the slots, and no class with waiters
  ever starves (a low class still gets its one slot per round). An idle class keeps no
  credit: its deficit is reset when it empties, so it cannot burst after a quiet spell.
- A request costs one slot, whatever its size: what this queue hands out is places in
  ``--max-in-flight``. Token budgets are the tenant limits' (``tenants``).
- Tenants of a class take turns, one request a turn, each in its own FIFO order.
- Pure and O(1) per push and pop (``remove``, for a waiter that gave up, is linear in its
  tenant's waiters); no asyncio here: ``admission`` owns the futures.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

# Slots per DRR round for each priority class (``TenantLimits.priority``): while all three
# wait, high gets 4 of every 7 freed slots, normal 2, low 1.
PRIORITY_WEIGHTS: Mapping[str, int] = {"high": 4, "normal": 2, "low": 1}


@dataclass
class _Class(Generic[T]):
    weight: int
    deficit: int = 0
    tenants: deque[str] = field(default_factory=deque)  # those with waiters, in turn order
    waiting: dict[str, deque[T]] = field(default_factory=dict)

    def take(self) -> T:
        tenant = self.tenants[0]
        queue = self.waiting[tenant]
        item = queue.popleft()
        if queue:
            self.tenants.rotate(-1)  # its next request waits for the other tenants' turns
        else:
            self.tenants.popleft()
            del self.waiting[tenant]
        return item


class FairQueue(Generic[T]):
    """Waiting items by (priority class, tenant); ``pop`` gives the next one's turn."""

    def __init__(self, weights: Mapping[str, int] = PRIORITY_WEIGHTS) -> None:
        bad = {name: w for name, w in weights.items() if isinstance(w, bool) or w < 1}
        if not weights or bad:
            raise ValueError(f"FairQueue 'weights' has value {dict(weights)!r}; expected >= 1")
        self._classes: dict[str, _Class[T]] = {n: _Class(w) for n, w in weights.items()}
        self._ring: deque[str] = deque()  # classes with waiters, in visiting order
        self._where: dict[T, tuple[str, str]] = {}  # item -> (class, tenant)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, item: object) -> bool:
        return item in self._where

    def waiting(self, priority: str) -> int:
        """How many items of class ``priority`` wait."""
        return sum(len(q) for q in self._classes[priority].waiting.values())

    def push(self, item: T, priority: str, tenant: str) -> None:
        """Queues ``item`` of ``tenant`` in class ``priority`` (a class of ``weights``)."""
        if item in self._where:
            raise ValueError(f"{item!r} is already waiting")
        cls = self._classes.get(priority)
        if cls is None:
            raise ValueError(f"priority {priority!r} is not one of {', '.join(self._classes)}")
        if not cls.tenants:
            self._ring.append(priority)  # a newly busy class joins at the end of the round
        if tenant not in cls.waiting:
            cls.tenants.append(tenant)
            cls.waiting[tenant] = deque()
        cls.waiting[tenant].append(item)
        self._where[item] = (priority, tenant)

    def pop(self) -> T | None:
        """The item whose turn is next, taken out of the queue; None if none waits."""
        if not self._ring:
            return None
        name = self._ring[0]
        cls = self._classes[name]
        if cls.deficit < 1:  # the round reached this class: its quantum
            cls.deficit += cls.weight
        item = cls.take()
        cls.deficit -= 1
        if not cls.tenants:  # emptied: it leaves the ring and keeps no credit
            self._ring.popleft()
            cls.deficit = 0
        elif cls.deficit < 1:  # its quantum is spent: the next class's visit
            self._ring.rotate(-1)
        del self._where[item]
        return item

    def remove(self, item: T) -> bool:
        """Takes ``item`` out (its waiter gave up); False if it was not waiting."""
        where = self._where.pop(item, None)
        if where is None:
            return False
        name, tenant = where
        cls = self._classes[name]
        queue = cls.waiting[tenant]
        queue.remove(item)
        if not queue:
            del cls.waiting[tenant]
            cls.tenants.remove(tenant)
            if not cls.tenants:
                self._ring.remove(name)
                cls.deficit = 0
        return True
