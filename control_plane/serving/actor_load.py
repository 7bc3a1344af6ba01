"""The load one control plane has put on an engine actor, in KV blocks, kept live.

Design decisions:

- The router needs each actor's load at every decision, so it is counted here, as the
  requests go, rather than asked of the actor (a stats call costs a round trip and is
  stale at once). An ``ActorLoad`` counts one control plane's requests; the requests
  other control planes routed to the actor are counted in a second one as their notes
  and deltas arrive (``ActorHandle.peer_load``, router replicas).
- A request is *prefilling* from admission until its first delta arrives, and counts
  the blocks it still has to compute: its prompt minus the blocks the router expected
  the actor to hold. Then it is *decoding* and counts every block it occupies, prompt
  and generated tokens, growing as tokens arrive. Both sums are kept up to date in O(1)
  per event, so building a candidate costs nothing.
- An engine that reports its prefill progress (``token_stream``'s ``"prefill"`` frames)
  replaces a prefilling request's count with the blocks it still has to compute
  (``progress``): a long prompt's chunked prefill is counted down as it goes instead of
  whole until its first token, so the router stops steering new prompts away from an
  actor about to be free. The engine's count wins over the router's expectation both
  ways (a prefix it expected may have been evicted meanwhile).
- Prefilling requests are the actor's queue (``waiting``): they wait for their first
  token, in the engine's waiting queue or in a prefill chunk. Overload shedding
  compares it with ``--max-queue``.
- ``release`` is idempotent: the stream that ends a request and the response that
  never started one may both release it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynask.kv.block import ceil_div

DEFAULT_BLOCK_SIZE = 16  # for engines that report none (echo, python): routing units only


@dataclass(slots=True)
class _Request:
    tokens: int  # prompt + generated so far
    prefill_blocks: int  # what it adds to ``prefill_blocks`` while prefilling
    decoding: bool = False


class ActorLoad:
    """Requests in flight on one actor and the KV blocks they account for."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"ActorLoad block_size has value {block_size!r}; expected an int >= 1")
        self.block_size = block_size
        self.prefill_blocks = 0
        self.decode_blocks = 0
        self.waiting = 0
        self._requests: dict[str, _Request] = {}

    def admit(self, request_id: str, prompt_tokens: int, cached_tokens: int = 0) -> None:
        """Counts a new request as prefilling ``prompt_tokens - cached_tokens`` tokens."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already counted on this actor")
        uncached = max(0, prompt_tokens - cached_tokens)
        request = _Request(prompt_tokens, self._blocks(uncached))
        self._requests[request_id] = request
        self.prefill_blocks += request.prefill_blocks
        self.waiting += 1

    def advance(self, request_id: str, new_tokens: int) -> None:
        """A delta arrived: the request decodes now and holds ``new_tokens`` more tokens."""
        request = self._requests.get(request_id)
        if request is None:
            return
        if not request.decoding:
            request.decoding = True
            self.prefill_blocks -= request.prefill_blocks
            self.waiting -= 1
            self.decode_blocks += self._blocks(request.tokens)
        before = self._blocks(request.tokens)
        request.tokens += new_tokens
        self.decode_blocks += self._blocks(request.tokens) - before

    def progress(self, request_id: str, pending_tokens: int) -> None:
        """The engine says the request has ``pending_tokens`` of its prompt left to
        compute; a no-op unless it is counted here and still prefilling."""
        request = self._requests.get(request_id)
        if request is None or request.decoding:
            return
        blocks = self._blocks(max(0, pending_tokens))
        self.prefill_blocks += blocks - request.prefill_blocks
        request.prefill_blocks = blocks

    def release(self, request_id: str) -> None:
        """The request ended (or never started); a no-op if it is not counted."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if request.decoding:
            self.decode_blocks -= self._blocks(request.tokens)
        else:
            self.prefill_blocks -= request.prefill_blocks
            self.waiting -= 1

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def _blocks(self, tokens: int) -> int:
        return ceil_div(tokens, self.block_size)
