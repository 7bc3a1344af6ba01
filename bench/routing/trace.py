"""A Mooncake-format request trace, and the token-id prompts it stands for.

One JSON object a line (``../shared/traces/README.md``): ``timestamp`` (arrival, ms),
``input_length`` and ``output_length`` (tokens), ``hash_ids`` (the prompt's blocks of
``TRACE_BLOCK_TOKENS`` tokens; two requests sharing a hash id share those tokens and,
the ids being chained, everything before them).

Design decisions:

- A prompt is built from its hash ids alone: block ``h`` is ``TRACE_BLOCK_TOKENS`` token
  ids drawn from ``random.Random((salt, h))``, so equal ids give equal tokens in every
  request and every run, and unequal ids (almost surely) differ in their first token.
  The last block is cut to what ``input_length`` leaves. A ``salt`` gives each measured
  phase its own tokens (the same structure, no hits on another phase's cache).
- A line with fewer hash ids than its length needs (or none) gets fresh negative ids for
  the blocks it lacks: unique tokens, as a trace without hash ids means.
- Token ids avoid the tokenizer's low ids (special tokens live there) and stay below the
  smallest vocabulary of the engines compared (SmolLM2's 49,152).
- The share of prompt blocks the trace itself can reuse (``reusable_block_share``) is
  what a single infinite prefix cache would hit: per request, its leading hash ids seen
  in an earlier request of the slice, over all its hash ids. No router can beat it.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_BLOCK_TOKENS = 512
TOKEN_RANGE = (1_000, 48_000)  # inside SmolLM2's vocabulary, past its special tokens


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One line of the trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        limit = TRACE_BLOCK_TOKENS * len(self.hash_ids)
        if self.input_length < 1:
            raise ValueError(
                f"TraceRequest input_length has value {self.input_length!r}; expected >= 1"
            )
        if self.input_length > limit:
            raise ValueError(
                f"TraceRequest input_length has value {self.input_length!r}; expected "
                f"1..{limit} (512 x {len(self.hash_ids)} hash ids)"
            )
        if self.output_length < 1:
            raise ValueError(
                f"TraceRequest output_length has value {self.output_length!r}; expected >= 1"
            )


def load_trace(path: Path) -> list[TraceRequest]:
    """Every request of a JSONL trace, in arrival order (file order among equal times).

    A line that names fewer blocks than its ``input_length`` needs (or no ``hash_ids``, as
    AIPerf's ``mooncake_trace`` allows) gets the blocks it lacks as ids of its own: fresh
    negative ids that no other request shares, so those tokens are never a prefix hit. A
    line that cannot be read is refused with its line number.
    """
    fresh_ids = itertools.count(-1, -1)
    requests = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                requests.append(_request_of(json.loads(line), fresh_ids))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path} line {number}: {exc}") from None
    return sorted(requests, key=lambda request: request.timestamp_ms)


def _request_of(row: Any, fresh_ids: Iterator[int]) -> TraceRequest:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    for name in ("timestamp", "input_length", "output_length"):
        if name not in row:
            raise ValueError(f"the request has no {name!r}")
    length = int(row["input_length"])
    hash_ids = [int(h) for h in row.get("hash_ids") or ()]
    lacking = -(-length // TRACE_BLOCK_TOKENS) - len(hash_ids)
    hash_ids += [next(fresh_ids) for _ in range(lacking)]
    return TraceRequest(float(row["timestamp"]), length, int(row["output_length"]), tuple(hash_ids))


def parse_slice(text: str) -> slice:
    """``START:STOP`` (either may be empty) as a slice of the trace's requests."""
    start, sep, stop = text.partition(":")
    if not sep:
        raise ValueError(f"--slice has value {text!r}; expected START:STOP, e.g. 3000:3200")
    return slice(int(start) if start else None, int(stop) if stop else None)


def warm_and_slice(
    trace: Sequence[TraceRequest], span: slice, warm: int
) -> tuple[list[TraceRequest], list[TraceRequest]]:
    """The ``warm`` requests before ``span`` (fewer at the trace's start) and ``span``'s
    requests; a negative START counts from the end, as in any slice."""
    start, stop, _ = span.indices(len(trace))
    return list(trace[max(0, start - warm) : start]), list(trace[start:stop])


def block_tokens(hash_id: int, salt: int = 0) -> list[int]:
    """The ``TRACE_BLOCK_TOKENS`` token ids of block ``hash_id``."""
    rng = random.Random(f"{salt}:{hash_id}")
    low, high = TOKEN_RANGE
    return [rng.randrange(low, high) for _ in range(TRACE_BLOCK_TOKENS)]


class PromptBuilder:
    """Token-id prompts of trace requests; each block's tokens are made once."""

    def __init__(self, salt: int = 0) -> None:
        self.salt = salt
        self._blocks: dict[int, list[int]] = {}

    def prompt(self, request: TraceRequest) -> list[int]:
        """``request.input_length`` token ids, block by block from its hash ids."""
        tokens: list[int] = []
        for hash_id in request.hash_ids:
            block = self._blocks.get(hash_id)
            if block is None:
                block = self._blocks[hash_id] = block_tokens(hash_id, self.salt)
            tokens.extend(block)
        return tokens[: request.input_length]


def reusable_block_share(
    requests: Sequence[TraceRequest], history: Sequence[TraceRequest] = ()
) -> float:
    """Of all prompt blocks of ``requests``, the share an infinite prefix cache would hit
    (holding ``history``'s blocks already: the requests replayed before them)."""
    total = reusable = 0
    for request, leading in _leading_seen_blocks(requests, history):
        reusable += leading
        total += len(request.hash_ids)
    return reusable / total if total else 0.0


def reusable_token_share(
    requests: Sequence[TraceRequest], engine_block: int, history: Sequence[TraceRequest] = ()
) -> float:
    """``reusable_block_share`` in prompt tokens an engine with ``engine_block``-token
    blocks can take from its cache: only its full blocks count, and never the last
    token (an engine must compute at least one token of the prompt)."""
    total = reusable = 0
    for request, leading in _leading_seen_blocks(requests, history):
        tokens = min(leading * TRACE_BLOCK_TOKENS, request.input_length - 1)
        reusable += tokens // engine_block * engine_block
        total += request.input_length
    return reusable / total if total else 0.0


def _leading_seen_blocks(
    requests: Sequence[TraceRequest], history: Sequence[TraceRequest]
) -> Iterator[tuple[TraceRequest, int]]:
    """Per request: how many of its leading hash ids ``history`` or an earlier request had."""
    seen = {hash_id for request in history for hash_id in request.hash_ids}
    for request in requests:
        leading = 0
        for hash_id in request.hash_ids:
            if hash_id not in seen:
                break
            leading += 1
        yield request, leading
        seen.update(request.hash_ids)
