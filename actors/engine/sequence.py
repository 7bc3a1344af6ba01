"""One request's state inside the engine, and the deltas the engine hands out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from dynask.actors.api.outputs import FinishReason, TokenLogprob, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.detokenizer import IncrementalDetokenizer
from dynask.actors.engine.grammar.structured_output import GrammarState
from dynask.actors.engine.logits.processing import TokenCounts
from dynask.actors.engine.sampling import draw_generator
from dynask.kv.block_pool import Block
from dynask.kv.hashing import SequenceHash


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it: tokens, progress, blocks, sampling state."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    seed: int  # of the request's draws: its own, or one the engine chose
    hash_seed: int
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens that came from the prefix cache (first pass)
    blocks: list[Block] = field(default_factory=list)
    block_hashes: list[SequenceHash] = field(default_factory=list)  # of full, cached blocks
    # Hashes of the leading full blocks of ``token_ids()`` computed so far, cached or not:
    # a token never changes once appended, so each block is hashed once per request
    # (``KVCacheManager.full_block_hashes``), not at every admission attempt.
    hashed_blocks: list[SequenceHash] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    grammar: GrammarState | None = None  # structured outputs: where the output is in it
    generator: torch.Generator = field(default_factory=torch.Generator)  # re-seeded per draw
    token_counts: TokenCounts | None = None  # penalties' state (logits.processing)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, if asked
    # The ids of ``blocks``, read once per block (``step_plan.block_ids``): the list they
    # were read from and the ids. ``blocks`` only grows in place or is replaced.
    block_id_memo: tuple[list[Block], list[int]] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return self.num_tokens - self.num_computed_tokens

    def next_draw(self) -> torch.Generator:
        """The generator for this request's next token: a function of its seed and the
        token's position, so a resumed request draws as the original would have."""
        return draw_generator(self.generator, self.seed, self.num_tokens)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def usage(self) -> Usage:
        return Usage(len(self.prompt_token_ids), len(self.output_token_ids), self.num_cached_tokens)
