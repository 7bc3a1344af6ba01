"""The cost-based chooser: exact costs, tie-breaks, modes, sampling, the decision log."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pytest

from dynask.control_plane.routing.kv_router import (
    ROUTING_MODES,
    Candidate,
    DecisionLog,
    KVRouter,
    OverloadThresholds,
    RouterConfig,
    RoutingDecision,
)
from dynask.kv.prefix_index import TierOverlap

PROMPT = [101, 102, 103, 104]  # local hashes of a four-block prompt


class FixedOverlaps:
    """A router whose every prompt meets the same prefix overlaps (device blocks)."""

    def __init__(self, overlaps: dict[str, int], router: KVRouter) -> None:
        self.overlaps = {actor: TierOverlap(blocks) for actor, blocks in overlaps.items()}
        self.router = router

    def choose(
        self, request_id: str, local_hashes: Sequence[int], candidates: Sequence[Candidate]
    ) -> RoutingDecision:
        return self.router.choose(request_id, local_hashes, candidates, self.overlaps)


def kv_router(overlaps: dict[str, int], **config) -> FixedOverlaps:
    return FixedOverlaps(overlaps, KVRouter(RouterConfig(**config), clock=lambda: 1700.0))


def test_the_actor_holding_the_prefix_wins() -> None:
    router = kv_router({"w1": 3})
    decision = router.choose("r1", PROMPT, [Candidate("w0"), Candidate("w1"), Candidate("w2")])

    assert decision.winner == "w1"
    assert [(s.actor, s.overlap_blocks, s.cost) for s in decision.scores] == [
        ("w0", 0, 4.0),
        ("w1", 3, 1.0),
        ("w2", 0, 4.0),
    ]


def test_recompute_weight_keeps_a_prefix_its_holder_is_a_little_busier_for() -> None:
    # a holds 3 of 4 blocks and has 3 blocks of prefill queued; b is idle, holds nothing.
    # Dynamo's cost (r = 1): a 1 + 3 = 4, b 4 + 0 = 4: a tie, b (fewer cached) takes it
    # and recomputes the 3 blocks. r = 3: a 3 x 1 + 3 = 6, b 3 x 4 = 12: a keeps it.
    a = Candidate("a", active_prefill_blocks=3, cached_blocks=30)
    b = Candidate("b")

    dynamo = kv_router({"a": 3}).choose("r1", PROMPT, [a, b])
    product = kv_router({"a": 3}, recompute_weight=3.0).choose("r1", PROMPT, [a, b])

    assert [(s.actor, s.cost) for s in dynamo.scores] == [("a", 4.0), ("b", 4.0)]
    assert dynamo.winner == "b"
    assert [(s.actor, s.cost) for s in product.scores] == [("a", 6.0), ("b", 12.0)]
    assert product.winner == "a"


def test_recompute_weight_still_gives_way_to_a_long_queue() -> None:
    # a holds 3 of 4 blocks but has 12 blocks of prefill queued: r = 3 gives a 3 + 12 = 15
    # against b's idle 12, so the prompt goes where it waits least after all.
    a = Candidate("a", active_prefill_blocks=12)
    decision = kv_router({"a": 3}, recompute_weight=3.0).choose("r1", PROMPT, [a, Candidate("b")])

    assert [(s.actor, s.cost) for s in decision.scores] == [("a", 15.0), ("b", 12.0)]
    assert decision.winner == "b"


def test_a_small_decode_weight_counts_decoding_streams_as_little_delay() -> None:
    # Both idle of prefill; a decodes 40 blocks and holds 2 of the 4, b holds none.
    # decode_weight 1: a 2 + 40 = 42 > b 4. decode_weight 0.1: a 2 + 4 = 6 > b 4 still,
    # and with r = 3: a 6 + 4 = 10 < b 12: a's prefix wins over its decoding streams.
    a = Candidate("a", active_decode_blocks=40)
    cases = [({}, "b", 42.0), ({"decode_weight": 0.1}, "b", 6.0)]
    cases.append(({"decode_weight": 0.1, "recompute_weight": 3.0}, "a", 10.0))
    for config, winner, cost_of_a in cases:
        decision = kv_router({"a": 2}, **config).choose("r1", PROMPT, [a, Candidate("b")])
        assert decision.winner == winner, config
        assert decision.scores[0].cost == pytest.approx(cost_of_a), config


def test_the_cost_terms_of_a_hand_computed_example() -> None:
    # w = 2: a holds 3 of 4 blocks but is busy; b holds nothing and is idle.
    # a: 2 * (1 uncached + 2 prefill) + 5 decode = 11;  b: 2 * (4 + 0) + 1 = 9.
    router = kv_router({"a": 3, "stranger": 4}, overlap_weight=2.0)
    a = Candidate("a", active_prefill_blocks=2, active_decode_blocks=5, cached_blocks=40)
    b = Candidate("b", active_decode_blocks=1, cached_blocks=7, queue_length=3)

    decision = router.choose("req-7", PROMPT, [a, b])

    assert decision.winner == "b"
    assert decision.winner_score.cost == 9.0
    assert decision.to_dict() == {
        "request_id": "req-7",
        "mode": "kv",
        "temperature": 0.0,
        "prompt_blocks": 4,
        "winner": "b",
        "decided_at": 1700.0,
        "compute_us": decision.compute_us,
        "candidates": [
            {
                "actor": "a",
                "overlap_blocks": 3,
                "host_overlap_blocks": 0,
                "disk_overlap_blocks": 0,
                "uncached_blocks": 1,
                "prefill_blocks": 2,
                "decode_blocks": 5,
                "cached_blocks": 40,
                "cost": 11.0,
            },
            {
                "actor": "b",
                "overlap_blocks": 0,
                "host_overlap_blocks": 0,
                "disk_overlap_blocks": 0,
                "uncached_blocks": 4,
                "prefill_blocks": 0,
                "decode_blocks": 1,
                "cached_blocks": 7,
                "cost": 9.0,
            },
        ],
    }
    assert 0 < decision.compute_us < 1_000_000
    assert json.loads(json.dumps(decision.to_dict())) == decision.to_dict()


def test_an_overlap_longer_than_the_prompt_is_capped() -> None:
    decision = kv_router({"w0": 9}).choose("r", PROMPT[:2], [Candidate("w0")])

    assert (decision.scores[0].overlap_blocks, decision.scores[0].uncached_blocks) == (2, 0)


def test_ties_go_to_the_fewest_cached_blocks() -> None:
    router = kv_router({})
    candidates = [Candidate("w0", cached_blocks=9), Candidate("w1", cached_blocks=2)]

    assert [router.choose(str(i), PROMPT, candidates).winner for i in range(5)] == ["w1"] * 5


def test_full_ties_are_broken_at_random_reproducibly() -> None:
    candidates = [Candidate("w0"), Candidate("w1"), Candidate("w2")]

    def winners(seed: int) -> list[str]:
        router = kv_router({}, seed=seed)
        return [router.choose(str(i), PROMPT, candidates).winner for i in range(30)]

    assert winners(3) == winners(3)
    assert set(winners(3)) == {"w0", "w1", "w2"}


def test_temperature_sampling_is_reproducible_and_prefers_low_cost() -> None:
    # Costs 1 (w1) and 4 (w0): weights exp(0) and exp(-0.75 / 0.5) = 0.223.
    candidates = [Candidate("w0"), Candidate("w1")]

    def winners(seed: int) -> list[str]:
        router = kv_router({"w1": 3}, temperature=0.5, seed=seed)
        return [router.choose(str(i), PROMPT, candidates).winner for i in range(400)]

    first = winners(11)
    assert first == winners(11)
    assert first != winners(12)
    counts = Counter(first)
    assert 0.1 < counts["w0"] / 400 < 0.3  # expected 0.223 / 1.223 = 0.18
    assert kv_router({}, temperature=0.5).choose("r", [], candidates).scores[0].cost == 0.0


def test_least_loaded_ignores_the_prefix_overlaps() -> None:
    router = kv_router({"w0": 4}, mode="least-loaded")
    busy, idle = Candidate("w0", active_decode_blocks=1), Candidate("w1")
    decision = router.choose("r", PROMPT, [busy, idle])

    assert decision.winner == "w1"
    assert [s.overlap_blocks for s in decision.scores] == [0, 0]
    assert not router.router.uses_overlaps  # so ModelRouting skips the index lookup


def test_round_robin_and_random_modes() -> None:
    candidates = [Candidate("w0", active_decode_blocks=50), Candidate("w1"), Candidate("w2")]
    round_robin = KVRouter(RouterConfig(mode="round-robin"))
    assert [round_robin.choose("r", PROMPT, candidates).winner for _ in range(4)] == [
        "w0",
        "w1",
        "w2",
        "w0",
    ]

    def random_winners() -> list[str]:
        router = KVRouter(RouterConfig(mode="random", seed=5))
        return [router.choose("r", PROMPT, candidates).winner for _ in range(20)]

    assert random_winners() == random_winners()
    assert set(random_winners()) == {"w0", "w1", "w2"}
    assert ROUTING_MODES == ("kv", "approximate", "least-loaded", "round-robin", "random")


def test_the_decision_log_is_bounded_and_newest_first() -> None:
    log = DecisionLog(maxlen=3)
    router = KVRouter(RouterConfig(mode="round-robin"), log=log)
    for number in range(5):
        router.choose(f"r{number}", PROMPT, [Candidate("w0")])

    assert len(log) == 3
    assert [d.request_id for d in log.recent()] == ["r4", "r3", "r2"]
    assert [d.request_id for d in log.recent(2)] == ["r4", "r3"]
    assert log.recent(0) == []
    assert DecisionLog()._decisions.maxlen == 1000


def test_overload_thresholds() -> None:
    limits = OverloadThresholds(max_active_blocks=10, max_queue=2)
    busy = Candidate("w0", active_prefill_blocks=4, active_decode_blocks=6)
    queued = Candidate("w1", queue_length=2)
    free = Candidate("w2", active_decode_blocks=9, queue_length=1)

    assert [limits.is_overloaded(c) for c in (busy, queued, free)] == [True, True, False]
    assert limits.all_overloaded([busy, queued])
    assert not limits.all_overloaded([busy, queued, free])
    assert limits.all_overloaded([])
    assert not OverloadThresholds().all_overloaded([busy, queued])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RouterConfig(mode="fastest"), "RouterConfig.mode has value 'fastest'; use one of"),
        (lambda: RouterConfig(overlap_weight=-1), "overlap_weight has value -1"),
        (lambda: RouterConfig(recompute_weight=-2), "recompute_weight has value -2"),
        (lambda: RouterConfig(temperature=float("inf")), "temperature has value inf"),
        (lambda: Candidate(""), "Candidate.actor has value ''"),
        (lambda: Candidate("w0", queue_length=-1), "Candidate.queue_length has value -1"),
        (lambda: Candidate("w0", cached_blocks=True), "Candidate.cached_blocks has value True"),
        (lambda: OverloadThresholds(max_queue=0), "OverloadThresholds.max_queue must be >= 1"),
        (lambda: DecisionLog(maxlen=0), "DecisionLog maxlen must be >= 1, got 0"),
        (lambda: DecisionLog().recent(-1), "limit must be >= 0, got -1"),
    ],
)
def test_bad_configuration_is_a_clear_value_error(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_the_candidates_must_be_present_and_distinct() -> None:
    router = kv_router({})
    with pytest.raises(ValueError, match="no candidate actors to route to"):
        router.choose("r", PROMPT, [])
    with pytest.raises(ValueError, match=r"distinct, got \['w0', 'w0'\]"):
        router.choose("r", PROMPT, [Candidate("w0"), Candidate("w0")])
