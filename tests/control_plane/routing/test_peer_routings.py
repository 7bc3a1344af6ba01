"""Router replicas, without actors: two control planes that hear each other's routings
(the ``"routed"`` records an actor passes on, relayed by ``replica_script``) score every
request exactly as one control plane routing the whole sequence does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pytest import approx

from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.actors.runtime.routed_requests import RoutedRequests
from dynask.actors.runtime.token_stream import pack_request, read_submission, routed_record
from dynask.control_plane.routing.peer_routings import PeerRouting, RoutingNote
from dynask.control_plane.routing.routing_options import RoutingOptions
from tests.control_plane.routing.replica_script import (
    C1,
    SCRIPT,
    ControlPlane,
    RelayingActors,
    canonical,
    play,
)
from tests.control_plane.routing_stack import tokens


def test_two_control_planes_that_hear_each_other_score_as_one() -> None:
    one = play([ControlPlane.new(RoutingOptions())])
    two = play([ControlPlane.new(RoutingOptions()), ControlPlane.new(RoutingOptions())])

    assert canonical(two) == canonical(one)
    # The scores themselves, named canonically: (winner, [(actor, overlap, prefill, decode, cost)]);
    # cost = 3 x uncached + queued prefill + 0.1 x decode blocks (the product's weights)
    assert canonical(one)[3] == (  # r4, 10 blocks: c0 holds 8 of them
        "c0",
        [("c0", 8, 8, 0, 14.0), ("c1", 0, 6, 0, 36.0), ("c2", 0, 4, 0, 34.0)],
    )
    assert canonical(one)[4] == (  # r5, 7 blocks: r1 decodes on c0 (8 blocks + 1 token: 9
        # blocks), r4 prefills its 2 uncached blocks there; C2's 6 blocks are predicted on c1
        "c1",
        [("c0", 0, 2, 9, approx(23.9)), ("c1", 6, 6, 0, 9.0), ("c2", 0, 4, 0, 25.0)],
    )


def test_without_replica_sync_the_second_control_plane_sees_idle_actors() -> None:
    options = RoutingOptions(replica_sync=False)
    two = play([ControlPlane.new(options), ControlPlane.new(options)])
    one = play([ControlPlane.new(RoutingOptions())])

    # r2, on the second control plane: it never heard that r1 (8 blocks) is prefilling
    # on one actor, so all three look idle, that one included (one router saw 8 there).
    assert sorted(s.prefill_blocks for s in two[1].scores) == [0, 0, 0]
    assert sorted(s.prefill_blocks for s in one[1].scores) == [0, 0, 8]
    assert canonical(two) != canonical(one)


def test_a_note_crosses_the_actor_unchanged_and_is_read_back_typed() -> None:
    note = RoutingNote(32, (1, 2**64 - 1, 5), 16, "kv", 1700000000.25)
    packed = pack_request("r-1", list(range(40)), {}, owner="cp-1", routed=note.to_wire())
    submission = read_submission(packed)
    record = routed_record(submission)

    assert submission.owner == "cp-1" and submission.request.prompt == list(range(40))
    assert record is not None
    assert PeerRouting.from_record(record) == PeerRouting("r-1", "cp-1", 40, note)
    assert routed_record(read_submission(pack_request("r-2", [1], {}, owner="cp-1"))) is None


def test_a_peer_request_counts_until_its_final_delta_and_its_own_are_skipped() -> None:
    plane, peer = ControlPlane.new(RoutingOptions()), ControlPlane.new(RoutingOptions())
    actors = RelayingActors([plane, peer])
    route = actors.route(plane, "r1", tokens(seed=5, blocks=3, extra=4))
    name = route.actor.name
    seen = peer.handle(name).peer_load

    assert len(plane.handle(name).peer_load) == 0  # its own: counted in load, not twice
    assert (seen.prefill_blocks, seen.decode_blocks, seen.waiting) == (4, 0, 1)
    assert peer.routing.find_matches(peer.routing.local_hashes(tokens(seed=5, blocks=3))) == {
        name: 3
    }
    actors.delta("r1", 1)
    assert (seen.prefill_blocks, seen.decode_blocks, seen.waiting) == (0, 4, 0)
    actors.delta("r1", 12, finished=True)  # 52 + 13 = 65 tokens, then released
    assert (seen.prefill_blocks, seen.decode_blocks, len(seen)) == (0, 0, 0)


def test_approximate_actors_learn_a_peers_routings_and_other_block_sizes_only_count_load() -> None:
    plane = ControlPlane.new(RoutingOptions(), kv_events=False)
    peer = ControlPlane.new(RoutingOptions(), kv_events=False)
    prompt = tokens(seed=6, blocks=5)
    route = RelayingActors([plane, peer]).route(plane, "r1", prompt)

    assert peer.routing.find_matches(peer.routing.local_hashes(prompt)) == {route.actor.name: 5}
    assert peer.routing.approx.num_blocks(route.actor.name) == 5

    idle = next(h for h in peer.handles if h is not peer.handle(route.actor.name))
    other = RoutingNote(0, (11, 12), 32, "kv", 0.0)  # 32-token blocks: not this model's
    idle._peer_routed([{"i": "x", "o": "cp-9", "n": 64, "r": other.to_wire()}])
    assert idle.peer_load.prefill_blocks == 4  # 64 tokens, in this actor's 16-token blocks
    assert peer.routing.approx.num_blocks(idle.name) == 0
    idle._peer_routed([{"i": "y", "o": "cp-9"}])  # unreadable: skipped, nothing counted
    assert len(idle.peer_load) == 1


def _kept_by_the_actors(
    kv_events: bool, steps: Sequence[tuple[Any, ...]] = SCRIPT
) -> tuple[ControlPlane, dict[str, RoutedRequests]]:
    """``steps`` (as ``SCRIPT``'s) routed by one control plane, with what each actor's
    stream keeps for a reader that connects later (``RoutedRequests``, fed as the actor
    feeds it)."""
    peer = ControlPlane.new(RoutingOptions(), kv_events=kv_events)
    actors = RelayingActors([peer])
    kept = {handle.name: RoutedRequests(keep_ended=not kv_events) for handle in peer.handles}
    for step in steps:
        if len(step) == 2:
            request_id, prompt = step
            route = actors.route(peer, request_id, prompt)
            assert route.note is not None
            packed = pack_request(
                request_id, prompt, {}, owner=route.actor.reader_id, routed=route.note.to_wire()
            )
            kept[route.actor.name].add([routed_record(read_submission(packed))])
        else:
            request_id, new_tokens, finished = step
            actors.delta(request_id, new_tokens, finished)
            reason = FinishReason.LENGTH if finished else None
            output = RequestOutput(request_id, "", (7,) * new_tokens, finish_reason=reason)
            kept[actors.winners[request_id]].advance([output])
    return peer, kept


def test_a_joiner_caught_up_by_approximate_actors_decides_as_its_peer() -> None:
    r9 = tokens(seed=19, blocks=5)  # no other request shares its blocks
    peer, kept = _kept_by_the_actors(False, [*SCRIPT, ("r9", r9), ("r9", 3, True)])
    joiner = ControlPlane.new(RoutingOptions(), kv_events=False)
    for name, routed in kept.items():  # each actor's first frame to the joiner
        joiner.handle(name)._peer_routed(routed.records())

    # r1 and r9 ended (their blocks are still assumed held), r2..r8 are in flight: load
    # and blocks as the peer has them, so the next prompts are scored alike.
    for handle in joiner.handles:
        theirs, mine = peer.handle(handle.name).load, handle.peer_load
        assert (mine.prefill_blocks, mine.decode_blocks, mine.waiting) == (
            theirs.prefill_blocks,
            theirs.decode_blocks,
            theirs.waiting,
        )
        assert joiner.routing.approx.num_blocks(handle.name) == peer.routing.approx.num_blocks(
            handle.name
        )
    for probe, overlap in (
        (C1 + tokens(seed=15, blocks=2), 8),
        (r9 + tokens(seed=20, blocks=1), 5),
    ):
        decisions = [p.routing.choose("p", probe, p.handles).decision for p in (peer, joiner)]
        assert canonical(decisions[1:]) == canonical(decisions[:1])
        assert decisions[0].winner_score.overlap_blocks == overlap


def test_a_joiner_of_actors_with_kv_events_counts_load_and_predicts_only_in_flight() -> None:
    peer, kept = _kept_by_the_actors(kv_events=True)
    joiner = ControlPlane.new(RoutingOptions(), kv_events=True)
    for name, routed in kept.items():
        joiner.handle(name)._peer_routed(routed.records())

    r8 = joiner.routing.local_hashes(SCRIPT[-1][1])
    assert joiner.routing.find_matches(r8) == peer.routing.find_matches(r8) != {}
    # r1 ended (its blocks come from the actor's KV dump), r2 decodes, r3..r8 wait.
    assert sum(h.peer_load.waiting for h in joiner.handles) == 6
    assert sum(len(h.peer_load) for h in joiner.handles) == 7
    # An ended request's record (as an actor without KV events would send it) adds no
    # predicted blocks where the exact index follows the cache.
    late = joiner.handles[0]
    prompt = tokens(seed=16, blocks=3)
    note = RoutingNote(0, tuple(joiner.routing.local_hashes(prompt)), 16, "kv", time.time())
    late._peer_routed([{"i": "gone", "o": "cp-9", "n": 48, "r": note.to_wire(), "g": 5, "e": True}])
    assert joiner.routing.find_matches(joiner.routing.local_hashes(prompt)) == {}
    assert "gone" not in late.peer_load


def test_a_caught_up_routing_is_noted_at_its_age() -> None:
    joiner = ControlPlane.new(RoutingOptions(approx_ttl_s=60.0), kv_events=False)
    fresh, stale = tokens(seed=17, blocks=2), tokens(seed=18, blocks=2)
    for request_id, prompt, age in (("fresh", fresh, 30.0), ("stale", stale, 61.0)):
        hashes = tuple(joiner.routing.local_hashes(prompt))
        note = RoutingNote(0, hashes, 16, "approximate", time.time() - age)
        record = {"i": request_id, "o": "cp-9", "n": 32, "r": note.to_wire(), "g": 1, "e": True}
        joiner.handles[0]._peer_routed([record])

    name = joiner.handles[0].name
    assert joiner.routing.find_matches(joiner.routing.local_hashes(fresh)) == {name: 2}
    assert joiner.routing.find_matches(joiner.routing.local_hashes(stale)) == {}
