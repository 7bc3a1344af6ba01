"""Router replicas: what one control plane routed, as the others in front of the same
actors hear it.

Design decisions:

- Each control plane counts the load it put on an actor (``ActorLoad``) and the prompts
  it routed before their KV events came (predicted blocks, or the approximate index).
  A second control plane saw none of that until the KV events arrived, so two of them
  behind one address both piled onto the actor that looked idle to each. Now a routed
  request carries its router's ``RoutingNote`` to the actor (``pack_request(routed=)``),
  and the actor, once it has queued the request, hands the note to every reader of its
  token stream (``token_stream``'s ``"routed"`` frame). Each other control plane counts
  the request in that actor's ``peer_load`` and notes its blocks as its router did
  (``ModelRouting``), so its next decision sees what one router would have seen.
- The request's later life needs no new message: its first delta (prefill over) and its
  final one (finished or aborted) are on the stream every reader already gets; the
  handle moves it in ``peer_load`` as it moves its own (``ActorHandle``).
- A control plane hears its own requests too and skips them by owner (the reader id it
  named in its hello); it also ignores a note whose blocks are of another block size.
- A control plane that connects later (started after the others, or restarted) is sent
  the records of the requests still in flight on the actor as the stream's first frame,
  each with the tokens it has produced so far (``actors.runtime.routed_requests``): it
  counts them as waiting for prefill or as decoding, as their router does, and notes
  their blocks at their age (``decided_at``). An actor whose engine publishes no KV events
  adds the requests that ended recently (``ended``, in a ``"routed_ended"`` frame that a
  control plane from before it skips): their blocks go into the joiner's approximate
  index at their age, as they are in its peers', and no load is counted.
- What is not shared: remote prefills of disaggregated requests (their prefill actors'
  load stays per control plane), and, to a joiner, ended requests beyond what the actor
  keeps (``actors.runtime.routed_requests``'s bounds).
- The stale window: a peer's routing reaches here after its submission call to the actor
  and one stream frame back (on one host about a millisecond, measured by the
  ``dynask_routing_peer_lag_seconds`` histogram from the note's ``decided_at``); requests
  routed meanwhile by this control plane do not see it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RoutingNote:
    """What a router assumed when it sent a request to an actor."""

    cached_tokens: int  # the prompt tokens it expected the actor to hold
    local_hashes: tuple[int, ...]  # the prompt's full blocks, as the router hashed them
    block_size: int  # of those blocks
    mode: str  # the routing mode that decided (which index it noted the blocks in)
    decided_at: float  # wall-clock seconds since the epoch

    def to_wire(self) -> dict[str, Any]:
        """Plain msgpack values for ``pack_request(routed=...)``; hashes as u64 bytes."""
        return {
            "c": self.cached_tokens,
            "h": array("Q", self.local_hashes).tobytes(),
            "b": self.block_size,
            "m": self.mode,
            "t": self.decided_at,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RoutingNote:
        hashes = array("Q")
        hashes.frombytes(data["h"])
        return cls(
            cached_tokens=int(data["c"]),
            local_hashes=tuple(hashes),
            block_size=int(data["b"]),
            mode=str(data["m"]),
            decided_at=float(data["t"]),
        )

    def with_cached(self, cached_tokens: int) -> RoutingNote:
        """The same note for a request that expects ``cached_tokens`` instead."""
        return RoutingNote(
            cached_tokens, self.local_hashes, self.block_size, self.mode, self.decided_at
        )


@dataclass(frozen=True, slots=True)
class PeerRouting:
    """One request another control plane routed to an actor (a ``"routed"`` record)."""

    request_id: str
    owner: str | None  # the reader id of the control plane that routed it
    prompt_tokens: int
    note: RoutingNote
    # Set for a request that was in flight when this control plane connected (the stream's
    # first frame): the tokens it had produced by then. None for one heard as it was routed.
    generated_tokens: int | None = None
    ended: bool = False  # it had ended by then (sent only by actors without KV events)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> PeerRouting:
        """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed record."""
        owner = record["o"]
        generated = None if record.get("g") is None else int(record["g"])
        if generated is not None and generated < 0:
            raise ValueError(f"negative generated tokens {generated}")
        return cls(
            request_id=str(record["i"]),
            owner=None if owner is None else str(owner),
            prompt_tokens=int(record["n"]),
            note=RoutingNote.from_wire(record["r"]),
            generated_tokens=generated,
            ended=record.get("e") is True,
        )


def read_peer_routings(payload: Sequence[Any]) -> list[PeerRouting]:
    """A ``"routed"`` frame's records; raises ``ValueError`` if one cannot be read."""
    try:
        return [PeerRouting.from_record(record) for record in payload]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"unreadable routed record: {exc!r}") from exc
