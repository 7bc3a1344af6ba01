"""The scheduler with a real block pool and no model: exact chunks, blocks and preemption."""

from __future__ import annotations

from dynask.actors.api.outputs import FinishReason
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.detokenizer import IncrementalDetokenizer
from dynask.actors.engine.kv_cache.manager import KVCacheManager
from dynask.actors.engine.scheduler import Scheduler, SchedulerConfig
from dynask.actors.engine.sequence import Sequence, SequenceStatus
from dynask.kv.block_pool import BlockPool
from dynask.kv.events import BlockStored, KVEventLog, KVEventRecord
from dynask.kv.hashing import DEFAULT_SEED, block_hashes


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


def test_blocks_are_hashed_once_per_request_and_cached_in_one_event() -> None:
    events = KVEventLog()
    pool = BlockPool(16, block_size=4, event_log=events)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=6, max_model_len=64),
        KVCacheManager(pool, block_size=4),
        frozenset({2}),
    )
    a = _seq("a", 9)  # blocks [1000..1003], [1004..1007], then a partial one
    expected = [pair.sequence for pair in block_hashes(a.prompt_token_ids, 4)]
    scheduler.add(a)

    assert _plan(scheduler) == [("a", 6)]  # 1 full block computed
    assert a.hashed_blocks == expected  # both prompt blocks hashed at admission
    assert _plan(scheduler) == [("a", 3)]
    assert a.block_hashes == expected
    assert events.drain() == [
        KVEventRecord(
            1, BlockStored.from_token_ids((expected[0],), None, (1000, 1001, 1002, 1003), 4)
        ),
        KVEventRecord(
            2, BlockStored.from_token_ids((expected[1],), expected[0], (1004, 1005, 1006, 1007), 4)
        ),
    ]
    scheduler.finish(a, FinishReason.ABORT)

    again = _seq("a", 9)  # the same prompt: a hit on both blocks, found by hash
    scheduler.add(again)
    assert _plan(scheduler) == [("a", 1)]
    assert again.num_cached_tokens == 8
    assert again.block_hashes == expected
    assert events.drain() == []


def test_a_waiting_sequence_is_not_looked_up_without_budget() -> None:
    scheduler = _scheduler(16, max_num_batched_tokens=4, max_model_len=64)
    a, b = _seq("a", 8), _seq("b", 8)
    scheduler.add(a)
    scheduler.add(b)

    assert _plan(scheduler) == [("a", 4)]  # the whole budget: b is never looked up
    assert b.hashed_blocks == []
    assert _plan(scheduler) == [("a", 4)]
    assert _plan(scheduler) == [("a", 1), ("b", 3)]
    assert len(b.hashed_blocks) == 1  # (8 - 1) // 4: the last token is always computed


def test_a_block_of_prompt_and_output_tokens_hashes_as_one_sequence() -> None:
    scheduler = _scheduler(16, max_num_batched_tokens=16, max_model_len=64)
    a = _seq("a", 6)
    scheduler.add(a)

    assert _plan(scheduler) == [("a", 6)]
    assert _plan(scheduler) == [("a", 1)]
    assert _plan(scheduler) == [("a", 1)]  # 8 computed: prompt[4:6] + two outputs filled
    assert a.token_ids() == [1000, 1001, 1002, 1003, 1004, 1005, 42, 42, 42]
    expected = [pair.sequence for pair in block_hashes([*range(1000, 1006), 42, 42], 4)]
    assert a.block_hashes == expected
    assert a.hashed_blocks == expected


def test_a_prompt_prefilled_in_chunks_reports_what_it_has_left() -> None:
    scheduler = _scheduler(16, max_num_batched_tokens=6, max_model_len=64)
    a, b = _seq("a", 15), _seq("b", 4)
    scheduler.add(a)
    scheduler.add(b)

    assert _plan(scheduler) == [("a", 6)]
    assert scheduler.take_prefill_progress() == {"a": 9}  # the engine's call after each step
    assert _plan(scheduler) == [("a", 6)]
    assert scheduler.take_prefill_progress() == {"a": 3}
    # a's prefill ends (its first token says so); b starts and ends in the same step.
    assert _plan(scheduler) == [("a", 3), ("b", 3)]
    assert scheduler.take_prefill_progress() == {"b": 1}
    assert _plan(scheduler) == [("a", 1), ("b", 1)]
    assert scheduler.take_prefill_progress() == {}  # decodes report nothing
