"""Control planes without actors, for router-replica tests: each is a ``ModelRouting``
over its own ``ActorHandle`` of each actor (no stream is opened), and ``RelayingActors``
does what the actors would: it packs each routed request as the handle does, reads it
back as the actor does and hands the ``routed_record`` to every control plane's handle
of that actor; deltas go to every handle as the stream reader hands them over. The
handles' own load is counted as the placer counts it (``reserve``, ``load.advance``,
``load.release``). ``SCRIPT`` is the sequence both replica tests route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.actors.runtime.token_stream import pack_request, read_submission, routed_record
from dynask.control_plane.routing.kv_router import RoutingDecision
from dynask.control_plane.routing.model_routing import ModelRouting, Route
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.metrics import ServingMetrics
from tests.control_plane.routing_stack import tokens

NAMES = ("a0", "a1", "a2")


def unconnected_handle(name: str, kv_events: bool = True) -> ActorHandle:
    info = ActorInfo(
        name=name,
        stream_address="127.0.0.1:1",
        max_model_len=4096,
        engine="mocker",
        model=None,
        worker="local",
        kv_events=kv_events,
        kv_block_size=16,
    )
    return ActorHandle(name=name, deployment="d", proxy=None, info=info)


@dataclass
class ControlPlane:
    """One control plane's routing of a model, over handles of its own."""

    routing: ModelRouting
    handles: list[ActorHandle]

    @classmethod
    def new(
        cls, options: RoutingOptions, kv_events: bool = True, names: Sequence[str] = NAMES
    ) -> ControlPlane:
        routing = ModelRouting("m", options, ServingMetrics())
        handles = [unconnected_handle(name, kv_events) for name in names]
        for handle in handles:
            if kv_events and options.replica_sync:  # add_actor's KV sync would ask a
                routing.follow_peers(handle)  # running actor for a dump: not here
            elif not kv_events:
                routing.add_actor(handle)
        return cls(routing, handles)

    def handle(self, name: str) -> ActorHandle:
        return next(h for h in self.handles if h.name == name)


@dataclass
class RelayingActors:
    """What the actors pass to every reader: routed records and deltas."""

    planes: list[ControlPlane]
    owners: dict[str, ControlPlane] = field(default_factory=dict)
    winners: dict[str, str] = field(default_factory=dict)

    def route(self, plane: ControlPlane, request_id: str, prompt: list[int]) -> Route:
        route = plane.routing.choose(request_id, prompt, plane.handles)
        route.actor.reserve(request_id, len(prompt), route.expected_cached_tokens)
        note = None if route.note is None else route.note.to_wire()
        packed = pack_request(request_id, prompt, {}, owner=route.actor.reader_id, routed=note)
        record = routed_record(read_submission(packed))
        if record is not None:
            for other in self.planes:  # the owner hears it too, and skips it
                other.handle(route.actor.name)._peer_routed([record])
        self.owners[request_id], self.winners[request_id] = plane, route.actor.name
        return route

    def delta(self, request_id: str, new_tokens: int, finished: bool = False) -> None:
        reason = FinishReason.LENGTH if finished else None
        output = RequestOutput(request_id, "", (7,) * new_tokens, finish_reason=reason)
        owner, actor = self.owners[request_id], self.winners[request_id]
        owner.handle(actor).load.advance(request_id, new_tokens)
        if finished:
            owner.handle(actor).load.release(request_id)
        for plane in self.planes:
            plane.handle(actor)._dispatch(output)  # the owner has no queue here: skipped


C1, C2, C3 = tokens(seed=1, blocks=8), tokens(seed=2, blocks=6), tokens(seed=3, blocks=4)
# (request id, prompt) or (request id, new tokens, finished): a delta of a routed request.
SCRIPT: list[tuple[Any, ...]] = [
    ("r1", C1),
    ("r2", C2),
    ("r3", C3),
    ("r4", C1 + tokens(seed=11, blocks=2)),
    ("r1", 1, False),  # r1's prefill is over: its 8 blocks count as decode load
    ("r5", C2 + tokens(seed=12, blocks=1, extra=5)),
    ("r6", C3 + tokens(seed=13, blocks=3)),
    ("r2", 1, False),
    ("r1", 40, True),  # r1 ends: 49 tokens, released
    ("r7", C1 + tokens(seed=11, blocks=2) + tokens(seed=14, blocks=1)),
    ("r8", tokens(seed=4, blocks=9)),
]

ROUTED_PROMPTS = [step[1] for step in SCRIPT if len(step) == 2]


def play(planes: Sequence[ControlPlane]) -> list[RoutingDecision]:
    """Routes ``SCRIPT``'s requests on ``planes`` in turn; every decision, in order."""
    actors = RelayingActors(list(planes))
    decisions, turn = [], 0
    for step in SCRIPT:
        if len(step) == 2:
            request_id, prompt = step
            decisions.append(actors.route(planes[turn % len(planes)], request_id, prompt).decision)
            turn += 1
        else:
            actors.delta(*step)
    return decisions


def canonical(decisions: Sequence[RoutingDecision]) -> list[tuple[Any, ...]]:
    """The decisions with actors named by the order they first won: actors that no
    request has reached yet are alike, so which of them a tie picked does not matter."""
    order: dict[str, str] = {}
    for decision in decisions:
        order.setdefault(decision.winner, f"c{len(order)}")
    for score in decisions[0].scores:
        order.setdefault(score.actor, f"c{len(order)}")
    return [
        (
            order[d.winner],
            sorted(
                (order[s.actor], s.overlap_blocks, s.prefill_blocks, s.decode_blocks, s.cost)
                for s in d.scores
            ),
        )
        for d in decisions
    ]
