"""KV-aware routing for one served model: its prefix indices, its routers, its decisions.

Design decisions:

- One ``PrefixIndex`` per served model, keyed by actor name, fed through an
  ``ActorKVSync`` per actor whose engine reports KV events (``info.kv_events``).
  Actors without (echo, python) go into an ``ApproxIndex`` instead: a prompt's blocks are
  assumed cached on the actor it was routed to, for a TTL, and pruned as the actor's
  engine evicts: at the cache size and eviction policy (plain or segmented LRU) the
  engine reported at start (``ActorInfo.kv_cache_tokens``, ``kv_protected_share``), or at
  most ``--router-approx-capacity-blocks`` per actor. ``find_tiered_matches`` merges the
  two (in mode ``kv`` only the approximate actors are read from the ``ApproxIndex``); ``choose``
  computes the overlaps there and hands them to the ``KVRouter``, a pure chooser that
  never calls back.
- Mode ``approximate`` (Dynamo's ``--no-router-kv-events``) routes every actor from the
  ``ApproxIndex``, KV events or not: each of its decisions is noted there, and its
  overlaps are read from there only. The exact index keeps following the events, so
  the two modes can be compared on one control plane.
- Predicted blocks (mode ``kv``): a prompt routed to an actor is in its cache once that
  actor has prefilled it, but its KV events come only then. A request sharing that
  prefix and routed before them would see no overlap and go elsewhere, splitting one
  conversation's cache over several actors. So every ``kv`` decision is also noted in
  ``predicted`` (an ``ApproxIndex`` with a short TTL, ``--router-predicted-ttl-secs``),
  and an actor's overlap is the larger of what its events say and what was routed to it.
  A block its events say it evicted is forgotten there too (``PrefixIndex.on_evicted``):
  otherwise a prompt routed while the actor held a prefix kept that prefix "cached" for
  the whole TTL after the engine evicted it, and the router sent the prefix's next turns
  (a 191k-token one, in the Mooncake trace) to an actor that must recompute them while
  counting them as cached in its load.
- Prompts are hashed in the block size of the model's first event-reporting actor (16
  when there is none). An actor with another block size is still served, but its blocks
  never match the prompt's hashes: its overlap is 0. The index under-reports then; it
  never misleads. (A model's deployments normally share one engine configuration.)
- Router replicas (``--router-replica-sync``, on by default): each routed request carries
  a ``RoutingNote`` to its actor, which passes it on to every other control plane
  reading that actor (``peer_routings``). Here a peer's note is noted in ``predicted`` or
  the ``ApproxIndex`` exactly as its own router noted it, and its load counts in the
  candidate's (``ActorHandle.peer_load``): two control planes score as one would.
- One ``KVRouter`` per mode, made on first use: round-robin keeps its turn, and requests
  that override the mode do not disturb the default's state. All of them record into
  the model's ``DecisionLog``.
- Candidates are the model's actors whose stream is up, with the load this control
  plane put on them (``ActorLoad``) and the blocks the index says they hold. Actors at an
  overload threshold are left out; when none is left, ``OverloadedError`` (a 503).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dynask.actors.api.actor_info import ActorInfo
from dynask.control_plane.routing.kv_event_sync import ActorKVSync
from dynask.control_plane.routing.kv_router import (
    APPROXIMATE_MODE,
    KV_MODE,
    ROUTING_MODES,
    Candidate,
    DecisionLog,
    KVRouter,
    RoutingDecision,
)
from dynask.control_plane.routing.peer_routings import PeerRouting, RoutingNote
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.actor_load import DEFAULT_BLOCK_SIZE
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.kv.approx_index import ApproxIndex
from dynask.kv.hashing import LocalBlockHash, local_block_hashes
from dynask.kv.prefix_index import PrefixIndex, TierOverlap

log = logging.getLogger(__name__)


class OverloadedError(RuntimeError):
    """Every actor of the model is at an overload threshold; the message says which."""


class NoReadyActorError(RuntimeError):
    """The model has no actor whose stream is up."""


@dataclass(frozen=True)
class Route:
    """Where one request goes, and why."""

    actor: ActorHandle
    decision: RoutingDecision
    expected_cached_tokens: int  # the winner's overlap, in tokens
    note: RoutingNote | None = None  # for the other control planes (``--router-replica-sync``)


class ModelRouting:
    """Routing state of one served model; see the module docstring."""

    def __init__(self, model: str, options: RoutingOptions, metrics: ServingMetrics) -> None:
        self.model = model
        self.options = options
        self.prefix = PrefixIndex(on_evicted=self._forget_predicted)
        self.approx = ApproxIndex(
            options.approx_ttl_s, capacity_blocks=options.approx_capacity_blocks
        )
        self.predicted = (
            ApproxIndex(options.predicted_ttl_s, capacity_blocks=options.approx_capacity_blocks)
            if options.predicted_ttl_s > 0
            else None
        )
        self.decisions = DecisionLog(options.log_size)
        self.block_size: int | None = None  # set by the first event-reporting actor
        self._metrics = metrics
        self._decision_seconds = metrics.routing_seconds.labels(model)  # resolved once
        self._peer_lag_seconds = metrics.routing_peer_lag_seconds.labels(model)
        metrics.init_model(model, ROUTING_MODES)
        self._thresholds = options.thresholds
        self._routers: dict[str, KVRouter] = {}
        self._syncs: dict[str, ActorKVSync] = {}
        self._approx_actors: dict[str, ActorInfo] = {}  # actors without KV events

    # ---- actors ---------------------------------------------------------------------

    def add_actor(self, handle: ActorHandle) -> None:
        """Starts following ``handle``'s KV events (from a dump), or its routed prompts."""
        block_size = handle.info.kv_block_size
        if self.options.replica_sync:
            self.follow_peers(handle)
        if not handle.info.kv_events or block_size is None:
            self._approx_actors[handle.name] = handle.info
            self._model_cache(handle.info)
            return
        if self.block_size is None:
            self.block_size = block_size
            for info in self._approx_actors.values():  # sized in the default blocks until now
                self._model_cache(info)
        elif block_size != self.block_size:
            log.warning(
                "engine actor %s of model '%s' has KV blocks of %d tokens, the model's "
                "others %d: its prefix cache will not be matched (overlap 0); give the "
                "model's deployments one block_size",
                handle.name,
                self.model,
                block_size,
                self.block_size,
            )
        self._model_cache(handle.info)
        resyncs = self._metrics.kv_resyncs
        sync = ActorKVSync(
            handle.name,
            self.prefix,
            handle.proxy.kv_cache_dump,
            on_resync=lambda actor, reason: resyncs.labels(actor, reason).inc(),
        )
        self._syncs[handle.name] = sync
        handle.listener = sync
        sync.start()

    def _model_cache(self, info: ActorInfo) -> None:
        """The approximate index prunes the actor's blocks as its engine evicts: at its
        cache's size in the router's blocks (unless ``--router-approx-capacity-blocks``
        sets one for all) and with its eviction's protected share."""
        capacity = None
        if info.kv_cache_tokens is not None and self.options.approx_capacity_blocks is None:
            capacity = max(1, info.kv_cache_tokens // (self.block_size or DEFAULT_BLOCK_SIZE))
        self.approx.set_actor_cache(info.name, capacity, info.kv_protected_share)

    def follow_peers(self, handle: ActorHandle) -> None:
        """Hears what other control planes route to ``handle``'s actor and counts it in its
        ``peer_load`` (``add_actor``, with ``--router-replica-sync``)."""
        name = handle.name
        handle.peer_listener = lambda routing: self._peer_routed(name, routing)

    def remove_actor(self, name: str) -> None:
        """Drops the actor's blocks from both indices."""
        sync = self._syncs.pop(name, None)
        if sync is not None:
            sync.close()
        self._approx_actors.pop(name, None)
        self.prefix.remove_actor(name)
        self.approx.remove_actor(name)
        if self.predicted is not None:
            self.predicted.remove_actor(name)

    def forget_cached(self, name: str) -> None:
        """The actor's engine emptied its prefix cache: what was assumed of it goes (its
        KV events clear the exact index; the approximate one only hears it here)."""
        self.approx.remove_actor(name)
        if self.predicted is not None:
            self.predicted.remove_actor(name)

    def sync(self, name: str) -> ActorKVSync | None:
        """The event follower of an actor (None for approximate or unknown actors)."""
        return self._syncs.get(name)

    async def wait_synced(self) -> None:
        """Returns once no actor's dump is on its way."""
        await asyncio.gather(*(sync.wait() for sync in list(self._syncs.values())))

    # ---- routing --------------------------------------------------------------------

    def find_matches(self, local_hashes: Sequence[int]) -> dict[str, int]:
        """Per actor, how many leading blocks of the prompt it holds (``MatchIndex``)."""
        tiered = self.find_tiered_matches(local_hashes)
        return {actor: overlap.total_blocks for actor, overlap in tiered.items()}

    def find_tiered_matches(
        self, local_hashes: Sequence[int], approximate: bool = False
    ) -> dict[str, TierOverlap]:
        """``find_matches`` by tier (``TieredMatchIndex``); approximate actors count as
        device. With ``approximate``, every actor's overlap is the ``ApproxIndex``'s."""
        if approximate:
            assumed = self.approx.find_matches(local_hashes)
            return {actor: TierOverlap(blocks) for actor, blocks in assumed.items()}
        matches = self.prefix.find_tiered_matches(local_hashes)
        if self.predicted is not None:
            for actor, blocks in self.predicted.find_matches(local_hashes).items():
                known = matches.get(actor)
                if known is None or known.total_blocks < blocks:
                    matches[actor] = TierOverlap(blocks)  # routed there, events not yet in
        if self._approx_actors:
            approx = self.approx.find_matches(local_hashes)
            matches.update(
                {
                    actor: TierOverlap(blocks)
                    for actor, blocks in approx.items()
                    if actor in self._approx_actors  # event actors' notes: mode approximate's
                }
            )
        return matches

    def local_hashes(self, prompt_ids: Sequence[int]) -> list[LocalBlockHash]:
        """The local hash of every full block of the prompt, in the model's block size."""
        size = self.block_size or DEFAULT_BLOCK_SIZE
        return local_block_hashes(prompt_ids, size, self.prefix.seed)

    def choose(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        actors: Sequence[ActorHandle],
        mode: str | None = None,
    ) -> Route:
        """Picks the actor for a prompt; raises ``NoReadyActorError``/``OverloadedError``."""
        ready = [actor for actor in actors if not actor.broken]
        if not ready:
            raise NoReadyActorError(f"no engine for model '{self.model}' is ready")
        candidates = [self._candidate(actor) for actor in ready]
        eligible = [c for c in candidates if not self._thresholds.is_overloaded(c)]
        if not eligible:
            raise OverloadedError(self._overload_message(candidates))
        hashes = self.local_hashes(prompt_ids)
        router = self._router(mode or self.options.mode)
        approximate = router.config.mode == APPROXIMATE_MODE
        overlaps = (
            self.find_tiered_matches(hashes, approximate) if router.uses_overlaps and hashes else {}
        )
        decision = router.choose(request_id, hashes, eligible, overlaps)
        self._note_routed(decision.mode, decision.winner, hashes)
        winner = next(actor for actor in ready if actor.name == decision.winner)
        overlap = decision.winner_score.overlap_blocks
        self._observe(decision, overlap)
        size = self.block_size or DEFAULT_BLOCK_SIZE
        note = None
        if self.options.replica_sync:
            note = RoutingNote(
                overlap * size, tuple(hashes), size, decision.mode, decision.decided_at
            )
        return Route(winner, decision, overlap * size, note)

    def _note_routed(
        self, mode: str, actor: str, hashes: Sequence[int], at: float | None = None
    ) -> None:
        """Where a routed prompt's blocks are assumed held until its KV events come (or,
        without events, for the approximate index's TTL); ``at``: when (monotonic) it was
        routed, if not now."""
        if mode == APPROXIMATE_MODE or actor in self._approx_actors:
            self.approx.note_routed(actor, hashes, now=at)
        elif mode == KV_MODE and self.predicted is not None:
            self.predicted.note_routed(actor, hashes, now=at)

    def _forget_predicted(self, actor: str, local_hashes: list[int]) -> None:
        if self.predicted is not None:
            self.predicted.forget(actor, local_hashes)

    def _peer_routed(self, actor: str, routing: PeerRouting) -> None:
        """Another control plane routed a request to ``actor``: its handle counts the load;
        its blocks are noted here as its router noted them (same block size only)."""
        note = routing.note
        caught_up = routing.generated_tokens is not None  # on connecting, not as routed
        age = max(0.0, time.time() - note.decided_at)
        if not caught_up:
            self._peer_lag_seconds.observe(age)
        if note.block_size != (self.block_size or DEFAULT_BLOCK_SIZE):
            return
        if not caught_up:
            self._note_routed(note.mode, actor, note.local_hashes)
            return
        # Caught up on connecting: routed a while ago. An ended request's blocks matter
        # only where nothing else tells what the actor holds (the approximate index).
        if routing.ended and not (note.mode == APPROXIMATE_MODE or actor in self._approx_actors):
            return
        self._note_routed(note.mode, actor, note.local_hashes, at=time.monotonic() - age)

    def _observe(self, decision: RoutingDecision, overlap: int) -> None:
        metrics = self._metrics
        self._decision_seconds.observe(decision.compute_us / 1e6)
        metrics.routing_overlap_blocks.labels(decision.winner).observe(overlap)
        metrics.routing_decisions.labels(self.model, decision.mode).inc()

    def _candidate(self, actor: ActorHandle) -> Candidate:
        load, peers, name = actor.load, actor.peer_load, actor.name
        cached = self.approx.num_blocks(name) if name in self._approx_actors else None
        return Candidate(
            actor=name,
            active_prefill_blocks=load.prefill_blocks + peers.prefill_blocks,
            active_decode_blocks=load.decode_blocks + peers.decode_blocks,
            cached_blocks=self.prefix.num_blocks(name) if cached is None else cached,
            queue_length=load.waiting + peers.waiting,
        )

    def _router(self, mode: str) -> KVRouter:
        router = self._routers.get(mode)
        if router is None:
            config = self.options.router_config(mode)
            router = KVRouter(config, log=self.decisions)
            self._routers[mode] = router
        return router

    def _overload_message(self, candidates: Sequence[Candidate]) -> str:
        limits = self._thresholds
        loads = ", ".join(
            f"{c.actor}: {c.active_blocks} active blocks, {c.queue_length} queued"
            for c in candidates
        )
        return (
            f"every engine of model '{self.model}' is at its limit "
            f"(max_active_blocks={limits.max_active_blocks}, max_queue={limits.max_queue}; "
            f"{loads}); retry shortly"
        )
