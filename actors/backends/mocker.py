"""``out=mocker``: the built-in engine with a simulated model, for scale tests.

Design decisions (after NVIDIA Dynamo's mocker):

- Everything but the model is real: ``MockerEngine`` IS an ``LLMEngine`` whose
  ``StepRunner`` is ``SimulatedRunner``. Scheduling, chunked prefill, block accounting,
  prefix caching, preemption, KV events and stats are the production code paths, so a
  router or planner tested against mockers sees what it would see against real engines.
- A step takes as long as the timing model says (``simulated_step_ms``): prefill cost is
  quadratic plus linear in the step's uncached prompt tokens (cached blocks are skipped
  by the scheduler, as on a GPU); decode cost is a base plus a term per KV block the
  decoding sequences read. The runner sleeps that long divided by ``speedup_ratio``;
  0 or infinity means no sleep at all ("maximum speed"). ``simulated_ms`` sums the model
  time whatever the speed-up, so tests can check it without measuring wall clocks.
- Tokens are drawn per request from its own ``random.Random``, seeded by the request's
  ``seed`` or else by (config seed, request id): output is reproducible and does not
  depend on what else is in the batch. EOS is drawn only with ``eos_probability``.
- There are no KV tensors. The engine is given a nominal model shape (1 layer, 1 KV head,
  head_dim 1), so ``export_kv`` returns zeros of the right shape,
  ``[1, 2, blocks, block_size, 1, 1]``, and ``import_kv`` checks the shape and keeps
  nothing; block bookkeeping around a transfer (``store_prefix``) is still real.
"""

from __future__ import annotations

import math
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dynask.actors.api.outputs import RequestOutput
from dynask.actors.backends.mocker_config import MockerConfig
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.engine_parts import EngineParts
from dynask.actors.engine.kv_cache.manager import KVCacheManager
from dynask.actors.engine.kv_cache.sizing import KVCachePlan
from dynask.actors.engine.model_config import ModelConfig
from dynask.actors.engine.scheduler import ScheduledChunk
from dynask.actors.engine.sequence import Sequence


@dataclass(frozen=True)
class StepShape:
    """What a step computes, as far as the timing model cares."""

    prefill_tokens: int  # uncached prompt tokens (or recomputed tokens) of the step
    decode_seqs: int  # sequences that decode one token
    active_decode_blocks: int  # KV blocks those sequences read

    @classmethod
    def of(cls, chunks: list[ScheduledChunk]) -> StepShape:
        decodes = [c.seq for c in chunks if _is_decode(c)]
        return cls(
            prefill_tokens=sum(c.num_new_tokens for c in chunks if not _is_decode(c)),
            decode_seqs=len(decodes),
            active_decode_blocks=sum(len(seq.blocks) for seq in decodes),
        )


def _is_decode(chunk: ScheduledChunk) -> bool:
    seq = chunk.seq
    return chunk.num_new_tokens == 1 and seq.num_computed_tokens >= len(seq.prompt_token_ids)


def simulated_step_ms(config: MockerConfig, shape: StepShape) -> float:
    """Model time of one step in milliseconds (before ``speedup_ratio``)."""
    tokens = shape.prefill_tokens
    prefill = config.prefill_quadratic_ms * tokens**2 + config.prefill_ms_per_token * tokens
    if tokens:
        prefill += config.prefill_ms_base
    decode = 0.0
    if shape.decode_seqs:
        blocks = shape.active_decode_blocks
        usage = min(1.0, blocks / config.num_kv_blocks)
        decode = (
            config.decode_ms_base
            + config.decode_ms_per_active_block * blocks
            + config.decode_ms_per_kv_usage * usage
            + config.decode_ms_per_kv_usage_squared * usage**2
        )
    return prefill + decode


def sleep_seconds(config: MockerConfig, step_ms: float) -> float:
    """Wall time to sleep for ``step_ms`` of model time; 0 at speed-up 0 or infinity."""
    if config.speedup_ratio == 0 or math.isinf(config.speedup_ratio):
        return 0.0
    return step_ms / 1000.0 / config.speedup_ratio


class SimulatedRunner:
    """A ``StepRunner`` that makes each step last the timing model's time and draws
    tokens at random.

    ``step_started`` is when the current step began: the end of the previous ``run``
    while the engine is busy, or the moment ``MockerEngine.step`` found it idle. ``run``
    sleeps only what the host work since then left of the step.
    """

    def __init__(
        self,
        config: MockerConfig,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(sorted(set(eos_token_ids)))
        self.block_size = config.block_size
        self.simulated_ms = 0.0
        self.step_started: float | None = None
        self._sleep = sleep
        self._clock = clock
        self._rngs: weakref.WeakKeyDictionary[Sequence, random.Random] = weakref.WeakKeyDictionary()

    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Lasts the step's model time (host work included); a token per chunk that ends
        its sequence."""
        step_ms = simulated_step_ms(self.config, StepShape.of(chunks))
        self.simulated_ms += step_ms
        seconds = sleep_seconds(self.config, step_ms)
        tokens = [self._draw(c.seq) if c.samples else None for c in chunks]
        if seconds > 0:
            started = self.step_started
            left = seconds if started is None else seconds - (self._clock() - started)
            if left > 0:
                self._sleep(left)
        self.start_step()  # the next step's host work counts from now
        return tokens

    def start_step(self) -> None:
        """The current step began now."""
        self.step_started = self._clock()

    def run_decode_burst(self, chunks: list[ScheduledChunk], steps: int) -> list[list[int]]:
        """``steps`` simulated decode steps of the same rows (each sleeps its model time)."""
        burst = []
        for _ in range(steps):  # a burst is decode only: every chunk samples
            burst.append([token for token in self.run(chunks) if token is not None])
        return burst

    def export_blocks(self, block_ids: list[int]) -> torch.Tensor:
        """Zeros shaped like real KV of the nominal model (there is no KV to read)."""
        return torch.zeros(self._kv_shape(len(block_ids)))

    def import_blocks(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Checks the shape of ``kv`` and keeps nothing (there is no KV to write)."""
        expected = self._kv_shape(len(block_ids))
        if tuple(kv.shape) != expected:
            raise ValueError(f"KV tensor has shape {tuple(kv.shape)}; expected {expected}")

    def _kv_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (1, 2, num_blocks, self.block_size, 1, 1)

    def _draw(self, seq: Sequence) -> int:
        rng = self._rngs.get(seq)
        if rng is None:
            rng = self._rngs[seq] = random.Random(_seed_of(self.config.seed, seq))
        wants_eos = self.eos_token_ids and self.config.eos_probability > 0
        if wants_eos and rng.random() < self.config.eos_probability:
            return rng.choice(self.eos_token_ids)
        while True:
            token = rng.randrange(self.vocab_size)
            if token not in self.eos_token_ids:
                return token


def _seed_of(config_seed: int, seq: Sequence) -> str:
    # A str seed hashes the same in every process (unlike hash(), salted per process).
    if seq.params.seed is not None:
        return f"seed:{seq.params.seed}"
    return f"request:{config_seed}:{seq.request_id}"


class MockerEngine(LLMEngine):
    """``LLMEngine`` with a ``SimulatedRunner``: real KV bookkeeping, no model weights."""

    def __init__(self, config: MockerConfig, tokenizer: Any) -> None:
        self.mocker_config = config
        vocab_size = config.vocab_size or len(tokenizer)
        eos = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
        self.runner = SimulatedRunner(config, vocab_size, eos)
        parts = _mocker_parts(config, tokenizer, self.runner)
        super().__init__(_engine_config(config), parts)

    def step(self) -> list[RequestOutput]:
        """One step; one that follows idling starts its model time now (see
        ``SimulatedRunner``), not at the end of the last busy step."""
        if not self.scheduler.has_work():
            self.runner.start_step()
        return super().step()

    def export_kv(self, block_ids: list[int]) -> torch.Tensor:
        """Zeros of the nominal shape, after the simulated wire time of the blocks (slept
        outside the step lock, so the engine keeps stepping meanwhile)."""
        kv = super().export_kv(block_ids)
        ms = self.mocker_config.kv_transfer_ms_per_block * len(block_ids)
        seconds = sleep_seconds(self.mocker_config, ms)
        if seconds > 0:
            time.sleep(seconds)
        return kv


def build_mocker_engine(config: MockerConfig, tokenizer: Any) -> MockerEngine:
    """A simulated engine of ``config``'s capacity and timing, speaking ``tokenizer``."""
    return MockerEngine(config, tokenizer)


def _engine_config(config: MockerConfig) -> EngineConfig:
    return EngineConfig(
        model=None,
        device="cpu",
        block_size=config.block_size,
        num_kv_blocks=config.num_kv_blocks,
        max_model_len=config.context_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enable_prefix_caching=config.enable_prefix_caching,
        seed=config.seed,
    )


def _mocker_parts(config: MockerConfig, tokenizer: Any, runner: SimulatedRunner) -> EngineParts:
    kv_manager, event_log = KVCacheManager.build(
        config.num_kv_blocks,
        config.block_size,
        config.enable_prefix_caching,
        config.prefix_cache_protected_share,
    )
    plan = KVCachePlan(
        num_blocks=config.num_kv_blocks,
        block_size=config.block_size,
        max_model_len=config.context_len,
        bytes_per_block=2 * config.block_size * 4,  # the nominal shape in float32
        budget_source=f"mocker num_kv_blocks={config.num_kv_blocks}",
    )
    return EngineParts(
        model_config=_nominal_model_config(
            runner.vocab_size, config.context_len, runner.eos_token_ids
        ),
        tokenizer=tokenizer,
        eos_token_ids=runner.eos_token_ids,
        plan=plan,
        runner=runner,
        kv_manager=kv_manager,
        event_log=event_log,
        model_origin="mocker",
    )


def _nominal_model_config(vocab_size: int, max_positions: int, eos: tuple[int, ...]) -> ModelConfig:
    """The smallest Llama shape: gives the engine its vocabulary and the KV tensor shape."""
    return ModelConfig(
        model_type="llama",
        vocab_size=vocab_size,
        hidden_size=1,
        intermediate_size=1,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        qk_norm=False,
        eos_token_ids=eos,
        hf_config=None,
    )
