"""The scheduler with a real block pool and no model: exact chunks, blocks and preemption."""

from __future__ import annotations

from dynask.actors.api.outputs import FinishReason
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.detokenizer import IncrementalDetokenizer
from dynask.actors.engine.kv_manager import KVCacheManager
from dynask.actors.engine.scheduler import Scheduler, SchedulerConfig
from dynask.actors.engine.sequence import Sequence, SequenceStatus
from dynask.kv.block_pool import BlockPool
from dynask.kv.hashing import DEFAULT_SEED


class _NoText:
    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def _seq(name: str, num_tokens: int, max_tokens: int = 100) -> Sequence:
    prompt = list(range(1000 * (ord(name) - 96), 1000 * (ord(name) - 96) + num_tokens))
    return Sequence(
        request_id=name,
        prompt_token_ids=prompt,
        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        detokenizer=IncrementalDetokenizer(_NoText(), prompt),
        seed=0,
        hash_seed=DEFAULT_SEED,
    )


def _scheduler(num_blocks: int, **config: int) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks, block_size=4), block_size=4)
    return Scheduler(SchedulerConfig(**config), kv, frozenset({2}))


def _plan(scheduler: Scheduler) -> list[tuple[str, int]]:
    out = scheduler.schedule()
    tokens = [42 if chunk.samples else None for chunk in out.chunks]
    scheduler.postprocess(out, tokens)
    return [(c.seq.request_id, c.num_new_tokens) for c in out.chunks]


def test_chunked_prefill_under_token_budget_then_decode() -> None:
    scheduler = _scheduler(16, max_num_batched_tokens=6, max_model_len=64)
    a, b = _seq("a", 9), _seq("b", 3)
    scheduler.add(a)
    scheduler.add(b)

    assert _plan(scheduler) == [("a", 6)]
    assert _plan(scheduler) == [("a", 3), ("b", 3)]
    assert _plan(scheduler) == [("a", 1), ("b", 1)]
    assert [int(blk.block_id) for blk in a.blocks] == [0, 1, 2]
    assert [int(blk.block_id) for blk in b.blocks] == [3]
    assert (a.output_token_ids, b.output_token_ids) == ([42, 42], [42, 42])


def test_prefill_is_capped_while_decodes_run() -> None:
    scheduler = _scheduler(
        32, max_num_batched_tokens=16, max_model_len=64, max_prefill_tokens_with_decodes=4
    )
    a, b, c = _seq("a", 3), _seq("b", 10), _seq("c", 5)
    scheduler.add(a)

    assert _plan(scheduler) == [("a", 3)]  # no decode running: the whole budget
    scheduler.add(b)
    scheduler.add(c)
    # a decodes, so prefill gets 4 tokens: b's first chunk; c waits (no prefill left).
    assert _plan(scheduler) == [("a", 1), ("b", 4)]
    assert _plan(scheduler) == [("a", 1), ("b", 4)]
    # b's last 2 tokens, then c's first 2 within the same 4-token prefill cap.
    assert _plan(scheduler) == [("a", 1), ("b", 2), ("c", 2)]
    assert _plan(scheduler) == [("a", 1), ("b", 1), ("c", 3)]
    assert _plan(scheduler) == [("a", 1), ("b", 1), ("c", 1)]


def test_without_a_cap_prefill_takes_the_whole_budget_beside_decodes() -> None:
    scheduler = _scheduler(32, max_num_batched_tokens=16, max_model_len=64)
    a, b = _seq("a", 3), _seq("b", 10)
    scheduler.add(a)
    _plan(scheduler)
    scheduler.add(b)

    assert _plan(scheduler) == [("a", 1), ("b", 10)]


def test_preemption_takes_the_newest_sequence_and_recomputes_it() -> None:
    scheduler = _scheduler(4, max_model_len=16)
    a, b = _seq("a", 8), _seq("b", 8)
    scheduler.add(a)
    scheduler.add(b)
    assert _plan(scheduler) == [("a", 8), ("b", 8)]  # 2 blocks each: the pool is full

    # a's 9th token needs a third block: b (newest) is preempted and its blocks freed.
    assert _plan(scheduler) == [("a", 1)]
    assert scheduler.num_preemptions == 1
    assert (b.status, b.num_computed_tokens, b.blocks) == (SequenceStatus.WAITING, 0, [])
    assert list(scheduler.waiting) == [b]
    # b's blocks were freed tail first, so a took b's second block and b's first block is
    # still cached. b comes back as a prefill of prompt + its token once a finishes.
    assert [int(blk.block_id) for blk in a.blocks] == [0, 1, 3]
    scheduler.finish(a, FinishReason.ABORT)
    assert _plan(scheduler) == [("b", 5)]  # 9 tokens, the first block (4) from the cache
    assert b.num_cached_tokens == 0  # cache credit counts only the first admission


def test_max_num_seqs_limits_admission() -> None:
    scheduler = _scheduler(32, max_num_seqs=2, max_model_len=64)
    for name in "abc":
        scheduler.add(_seq(name, 2))

    assert _plan(scheduler) == [("a", 2), ("b", 2)]
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_finished_sequences_return_all_blocks() -> None:
    scheduler = _scheduler(8, max_model_len=64)
    scheduler.add(_seq("a", 5, max_tokens=2))

    _plan(scheduler)
    _plan(scheduler)

    assert scheduler.running == []
    assert scheduler.kv.pool.num_free_blocks == 8
