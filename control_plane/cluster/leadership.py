"""Which of several control planes in front of one cluster reconciles: a lease.

Any number of control planes (``dynask serve`` or ``run in=http out=dyn://POOL``) may
serve the same engine actors; each routes over token streams of its own. Exactly one,
the *leader*, reconciles: starts, stops and replaces actors, closes stale actor rows,
runs the planner. The others are *followers*: they adopt what the leader publishes and
never stop an actor.

Design decisions:
- The lease lives on the Dask scheduler, not in the database. The scheduler is the one
  thing every control plane shares: ``dyn://`` front ends on different hosts each have
  their own SQLite file, and an actor cannot outlive the scheduler anyway.
- The scheduler offers no compare-and-swap, but ``publish_dataset`` without ``override``
  is create-if-absent, atomically (it raises ``KeyError`` when the name is taken). So
  leadership comes in numbered *terms*, each a dataset ``dynask-leader/SCOPE/N``; taking
  over is creating term N+1, and of several followers racing for it exactly one wins.
- Expiry by observation, as in Kubernetes' leader election: the leader bumps its term's
  renewal counter every round; a follower that has seen the same counter for ``ttl_s``
  on its *own* monotonic clock takes the next term. No two hosts' clocks are compared. A
  killed leader is replaced within ``ttl_s`` plus two rounds (its last renewal is seen
  up to a round late, and expiry is noticed up to a round late): 7 s by default.
- A leader that could not renew for ``step_down_s`` (less than ``ttl_s``) steps down by
  itself, and one that finds a later term knows it was deposed: two leaders act at
  once only while a leader's event loop is stalled past ``step_down_s``.
- A leader that exits normally marks its term released; a follower takes the next term
  at its next round, without waiting out the TTL (``hand_over``). Followers sign in
  (``dynask-follower/SCOPE/ID``) and out, so a leader without any exits at once.
- SCOPE separates groups of control planes sharing a scheduler: ``cluster`` for
  ``dynask serve``, ``pool-NAME`` for the front ends of one pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

log = logging.getLogger(__name__)

DATASET_PREFIX = "dynask-leader/"
FOLLOWER_PREFIX = "dynask-follower/"
RENEW_INTERVAL_S = 1.0
LEASE_TTL_S = 5.0
STEP_DOWN_S = 3.0
HANDOVER_WAIT_S = 3.0


class ControlPlaneRole(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True)
class Term:
    """One leadership term as stored: who holds it, how often it was renewed."""

    number: int
    holder: str
    renewals: int = 0
    released: bool = False


class TermStore(Protocol):
    """Where terms live; ``create`` must be create-if-absent, atomically."""

    async def latest(self) -> Term | None: ...

    async def create(self, term: Term) -> bool: ...

    async def renew(self, term: Term) -> None: ...

    async def drop_before(self, number: int) -> None: ...

    async def sign_in(self, holder: str) -> None: ...

    async def sign_out(self, holder: str) -> None: ...

    async def followers(self) -> set[str]: ...


class DatasetTermStore:
    """Terms as scheduler datasets ``dynask-leader/SCOPE/N`` (plain dicts: the scheduler
    needs none of dynask's code to hold them)."""

    def __init__(self, client: Any, scope: str) -> None:
        self.client = client
        self.prefix = f"{DATASET_PREFIX}{scope}/"
        self.follower_prefix = f"{FOLLOWER_PREFIX}{scope}/"

    async def _numbers(self) -> list[int]:
        names = [str(n) for n in await self.client.list_datasets()]
        return sorted(int(n.removeprefix(self.prefix)) for n in names if n.startswith(self.prefix))

    async def latest(self) -> Term | None:
        for number in reversed(await self._numbers()):
            with contextlib.suppress(KeyError):  # dropped by a new leader meanwhile
                record = await self.client.get_dataset(f"{self.prefix}{number}")
                return Term(number, record["holder"], record["renewals"], record["released"])
        return None

    async def create(self, term: Term) -> bool:
        try:
            await self.client.publish_dataset(self._record(term), name=self._name(term))
        except KeyError:  # another follower took this term first
            return False
        return True

    async def renew(self, term: Term) -> None:
        await self.client.publish_dataset(self._record(term), name=self._name(term), override=True)

    async def drop_before(self, number: int) -> None:
        for older in await self._numbers():
            if older < number:
                with contextlib.suppress(KeyError):
                    await self.client.unpublish_dataset(f"{self.prefix}{older}")

    async def sign_in(self, holder: str) -> None:
        await self.client.publish_dataset(True, name=self.follower_prefix + holder, override=True)

    async def sign_out(self, holder: str) -> None:
        with contextlib.suppress(KeyError):
            await self.client.unpublish_dataset(self.follower_prefix + holder)

    async def followers(self) -> set[str]:
        names = [str(n) for n in await self.client.list_datasets()]
        prefix = self.follower_prefix
        return {n.removeprefix(prefix) for n in names if n.startswith(prefix)}

    def _name(self, term: Term) -> str:
        return f"{self.prefix}{term.number}"

    @staticmethod
    def _record(term: Term) -> dict[str, Any]:
        return {"holder": term.holder, "renewals": term.renewals, "released": term.released}


class Lease:
    """This control plane's side of the lease; ``tick`` once per ``RENEW_INTERVAL_S``."""

    def __init__(
        self,
        store: TermStore,
        holder: str,
        *,
        ttl_s: float = LEASE_TTL_S,
        step_down_s: float = STEP_DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < step_down_s < ttl_s:
            raise ValueError(
                f"Lease 'step_down_s' has value {step_down_s}; it must be above 0 and below "
                f"'ttl_s' ({ttl_s}), or a deposed leader could act beside its successor"
            )
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.step_down_s = step_down_s
        self.clock = clock
        self.role = ControlPlaneRole.FOLLOWER
        self.term: Term | None = None  # ours while leader, else the latest seen
        self._seen: tuple[int, int, bool] | None = None  # (number, renewals, released)
        self._seen_at: float | None = None  # when _seen last changed (None: never looked)
        self._renewed_at = 0.0
        self._signed_in = False

    @property
    def leader(self) -> str | None:
        """The holder of the latest term seen (None: no term yet, or released)."""
        if self.term is None or self.term.released:
            return None
        return self.term.holder

    async def tick(self) -> ControlPlaneRole:
        """One round: the leader renews (or finds it was deposed); a follower watches the
        term and takes the next one once it expired or was released. A store that fails
        costs the leader its role after ``step_down_s``."""
        try:
            if self.role is ControlPlaneRole.LEADER:
                await self._renew()
            else:
                await self._watch()
            await self._sign(self.role is ControlPlaneRole.FOLLOWER)
        except Exception as exc:  # the scheduler is away: the next round retries
            log.warning("lease round failed: %s", exc)
            if (
                self.role is ControlPlaneRole.LEADER
                and self.clock() - self._renewed_at > self.step_down_s
            ):
                log.warning("could not renew the lease for %.1fs; stepping down", self.step_down_s)
                self.role = ControlPlaneRole.FOLLOWER
        return self.role

    async def _renew(self) -> None:
        assert self.term is not None
        latest = await self.store.latest()
        if latest is None or latest.number != self.term.number:
            log.warning("leadership term %d was taken over; following", self.term.number)
            self.role = ControlPlaneRole.FOLLOWER
            self._observe(latest)
            return
        renewed = replace(self.term, renewals=self.term.renewals + 1)
        await self.store.renew(renewed)
        self.term, self._renewed_at = renewed, self.clock()

    async def _watch(self) -> None:
        latest = await self.store.latest()
        self._observe(latest)
        assert self._seen_at is not None
        expired = self.clock() - self._seen_at >= self.ttl_s
        if latest is not None and not latest.released and not expired:
            return
        mine = Term(number=(latest.number if latest else 0) + 1, holder=self.holder)
        if not await self.store.create(mine):
            return
        self.role, self.term, self._renewed_at = ControlPlaneRole.LEADER, mine, self.clock()
        log.warning("leading as %s (term %d)", self.holder, mine.number)
        await self.store.drop_before(mine.number)

    async def _sign(self, following: bool) -> None:
        if following != self._signed_in:
            await (self.store.sign_in if following else self.store.sign_out)(self.holder)
            self._signed_in = following

    def _observe(self, latest: Term | None) -> None:
        seen = None if latest is None else (latest.number, latest.renewals, latest.released)
        if seen != self._seen or self._seen_at is None:
            self._seen, self._seen_at = seen, self.clock()
        self.term = latest

    async def keep(self, on_change: Callable[[ControlPlaneRole], None]) -> None:
        """Ticks every ``RENEW_INTERVAL_S`` forever; ``on_change`` hears each new role."""
        while True:
            before = self.role
            if await self.tick() is not before:
                on_change(self.role)
            await asyncio.sleep(RENEW_INTERVAL_S)

    async def hand_over(self, wait_s: float = HANDOVER_WAIT_S) -> bool:
        """Leaving: a follower signs out; a leader releases its term and, if followers
        are signed in, waits up to ``wait_s`` for one to take the next term. True when
        another control plane leads now (so this one must leave the actors running);
        False when none did (this was the last one). A scheduler gone
        midway keeps the actors once the term was released."""
        try:
            return await self._hand_over(wait_s)
        except Exception as exc:  # the scheduler is away: nobody can take over
            log.warning("could not hand the lease over: %s", exc)
            return self.role is ControlPlaneRole.FOLLOWER

    async def _hand_over(self, wait_s: float) -> bool:
        if self.role is not ControlPlaneRole.LEADER or self.term is None:
            await self._sign(following=False)
            return True
        ours = self.term.number
        await self.store.renew(replace(self.term, released=True))
        self.role = ControlPlaneRole.FOLLOWER
        if not await self.store.followers() - {self.holder}:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while loop.time() < deadline:
            latest = await self.store.latest()
            if latest is not None and latest.number > ours:
                return True
            await asyncio.sleep(RENEW_INTERVAL_S / 4)
        return False
