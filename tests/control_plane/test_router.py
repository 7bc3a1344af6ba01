"""The simple routing modes, with exact choices."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dynask.control_plane.router import Router


@dataclass
class Actor:
    name: str
    in_flight: int = 0
    broken: bool = False


def test_least_loaded_picks_the_fewest_in_flight_and_rotates_ties() -> None:
    a, b, c = Actor("a", 2), Actor("b", 0), Actor("c", 0)
    router = Router("least-loaded")

    assert [router.choose([a, b, c]).name for _ in range(4)] == ["b", "c", "b", "c"]  # type: ignore[union-attr]


def test_round_robin_skips_broken_actors() -> None:
    a, b, c = Actor("a"), Actor("b", broken=True), Actor("c")
    router = Router("round-robin")

    assert [router.choose([a, b, c]).name for _ in range(3)] == ["a", "c", "a"]  # type: ignore[union-attr]


def test_random_is_reproducible_with_a_seed() -> None:
    actors = [Actor(str(i)) for i in range(5)]
    picks = [Router("random", seed=3).choose(actors) for _ in range(1)]
    again = [Router("random", seed=3).choose(actors) for _ in range(1)]
    assert picks == again


def test_no_usable_actor_gives_none() -> None:
    assert Router().choose([Actor("a", broken=True)]) is None


def test_unknown_mode_is_named() -> None:
    with pytest.raises(ValueError, match="router mode 'kv-magic' is not known; use one of"):
        Router("kv-magic")
