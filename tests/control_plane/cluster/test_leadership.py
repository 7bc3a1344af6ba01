"""The leadership lease on a real (in-process) Dask scheduler, with a hand-turned clock:
who leads, exactly when a silent leader's term expires, and that one follower wins."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from distributed import Client, Scheduler

from dynask.control_plane.cluster.leadership import (
    ControlPlaneRole,
    DatasetTermStore,
    Lease,
    Term,
)

LEADER, FOLLOWER = ControlPlaneRole.LEADER, ControlPlaneRole.FOLLOWER


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _on_a_scheduler(test: Callable[[Any, Clock], Awaitable[None]]) -> None:
    async def main() -> None:
        async with (
            Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler,
            Client(scheduler.address, asynchronous=True) as client,  # type: ignore[no-untyped-call]
        ):
            await test(client, Clock())

    asyncio.run(main())


def _lease(client: Any, holder: str, clock: Clock, scope: str = "cluster") -> Lease:
    return Lease(DatasetTermStore(client, scope), holder, ttl_s=5.0, step_down_s=3.0, clock=clock)


def test_the_first_leads_and_a_silent_leader_is_replaced_after_exactly_the_ttl() -> None:
    async def test(client: Any, clock: Clock) -> None:
        a, b = _lease(client, "a", clock), _lease(client, "b", clock)
        assert await a.tick() is LEADER
        assert await b.tick() is FOLLOWER
        assert (b.leader, a.term) == ("a", Term(1, "a"))
        store = DatasetTermStore(client, "cluster")
        assert await store.followers() == {"b"}  # signed in as it followed
        for _ in range(3):  # a renews each round: b never takes over
            clock.now += 4.0
            assert (await a.tick(), await b.tick()) == (LEADER, FOLLOWER)
        assert a.term == Term(1, "a", renewals=3)
        clock.now += 4.99  # a is killed: renews no more
        assert await b.tick() is FOLLOWER
        clock.now += 0.01  # 5 s since b last saw the counter move
        assert await b.tick() is LEADER
        assert b.term == Term(2, "b")
        assert await DatasetTermStore(client, "cluster").latest() == Term(2, "b")
        names = sorted(str(n) for n in await client.list_datasets())
        assert names == ["dynask-leader/cluster/2"]  # the dead term dropped, b signed out

    _on_a_scheduler(test)


def test_of_two_followers_exactly_one_takes_the_expired_term() -> None:
    async def test(client: Any, clock: Clock) -> None:
        a, b, c = (_lease(client, h, clock) for h in "abc")
        assert [await x.tick() for x in (a, b, c)] == [LEADER, FOLLOWER, FOLLOWER]
        clock.now += 5.0
        roles = await asyncio.gather(b.tick(), c.tick())
        assert sorted(r.value for r in roles) == ["follower", "leader"]
        winner = b if b.role is LEADER else c
        assert (await c.tick() if winner is b else await b.tick()) is FOLLOWER
        assert (b.leader, c.leader) == (winner.holder, winner.holder)
        assert await a.tick() is FOLLOWER  # the old leader woke up: deposed, it follows
        assert a.leader == winner.holder

    _on_a_scheduler(test)


def test_a_leader_that_cannot_renew_steps_down_before_the_ttl() -> None:
    async def test(client: Any, clock: Clock) -> None:
        a = _lease(client, "a", clock)
        assert await a.tick() is LEADER

        async def unreachable(_: Term) -> None:
            raise OSError("scheduler away")

        a.store.renew = unreachable  # type: ignore[method-assign]
        clock.now += 3.0
        assert await a.tick() is LEADER  # 3 s: not yet overdue
        clock.now += 0.01
        assert await a.tick() is FOLLOWER

    _on_a_scheduler(test)


def test_a_handover_is_taken_at_the_next_round_and_an_unanswered_one_says_so() -> None:
    async def test(client: Any, clock: Clock) -> None:
        a, b = _lease(client, "a", clock), _lease(client, "b", clock)
        assert (await a.tick(), await b.tick()) == (LEADER, FOLLOWER)

        async def b_round() -> ControlPlaneRole:
            await asyncio.sleep(0.05)
            return await b.tick()  # no clock advance: the release alone lets b lead

        handed, b_role = await asyncio.gather(a.hand_over(wait_s=2.0), b_round())
        assert (handed, b_role, a.role) == (True, LEADER, FOLLOWER)
        assert b.term == Term(2, "b")
        started = asyncio.get_running_loop().time()
        assert await b.hand_over(wait_s=5.0) is False  # nobody signed in to take it
        assert asyncio.get_running_loop().time() - started < 1.0  # so no waiting
        assert await b.store.latest() == Term(2, "b", released=True)

    _on_a_scheduler(test)


def test_scopes_lease_apart_and_bad_timings_are_refused() -> None:
    async def test(client: Any, clock: Clock) -> None:
        assert await _lease(client, "a", clock, "pool-llama").tick() is LEADER
        assert await _lease(client, "b", clock, "pool-qwen").tick() is LEADER
        assert await _lease(client, "c", clock, "pool-llama").tick() is FOLLOWER

    _on_a_scheduler(test)
    with pytest.raises(ValueError, match="'step_down_s' has value 5.0"):
        Lease(DatasetTermStore(None, "x"), "a", ttl_s=5.0, step_down_s=5.0)
