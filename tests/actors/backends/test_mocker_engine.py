"""``MockerEngine``: real block accounting, prefix cache and KV events; simulated timing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from dynask.actors.api.engine_protocol import Engine
from dynask.actors.api.outputs import FinishReason
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.streams import RequestStream
from dynask.actors.backends.mocker import (
    MockerConfig,
    MockerEngine,
    SimulatedRunner,
    StepShape,
    build_mocker_engine,
    simulated_step_ms,
    sleep_seconds,
)
from dynask.actors.models.tokenizer_folder import load_tokenizer
from dynask.kv.events import BlockStored
from dynask.kv.hashing import SequenceHash, chain_hash, local_block_hash

# Binary-exact numbers, so the timing model can be checked with ==.
TIMING: dict[str, Any] = {
    "prefill_quadratic_ms": 0.5,
    "prefill_ms_per_token": 2.0,
    "decode_ms_base": 3.0,
    "decode_ms_per_active_block": 0.25,
}
PROMPT = list(range(1000, 1020))  # 20 tokens = 5 blocks of 4
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder: Path) -> Any:
    return load_tokenizer(smollm2_folder)


def mocker(tokenizer: Any, **overrides: Any) -> MockerEngine:
    settings: dict[str, Any] = {"num_kv_blocks": 64, "block_size": 4, "speedup_ratio": 0.0}
    return build_mocker_engine(MockerConfig(**{**settings, **overrides}), tokenizer)


def run_all(
    engine: MockerEngine, prompts: list[list[int]], params: SamplingParams, prefix: str = "r"
) -> list[RequestStream]:
    """Runs prompts to the end, inline, as requests ``{prefix}0``, ``{prefix}1``, ..."""
    streams = [engine.add_request(p, params, f"{prefix}{i}") for i, p in enumerate(prompts)]
    while not all(s.finished for s in streams):
        engine.step()
    return streams


# ---- the timing model -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "expected_ms"),
    [
        (StepShape(prefill_tokens=0, decode_seqs=0, active_decode_blocks=0), 0.0),
        (StepShape(prefill_tokens=10, decode_seqs=0, active_decode_blocks=0), 70.0),
        (StepShape(prefill_tokens=0, decode_seqs=2, active_decode_blocks=6), 4.5),
        (StepShape(prefill_tokens=10, decode_seqs=2, active_decode_blocks=6), 74.5),
    ],
)
def test_step_time_is_quadratic_prefill_plus_decode(shape: StepShape, expected_ms: float) -> None:
    assert simulated_step_ms(MockerConfig(**TIMING), shape) == expected_ms


def test_decode_time_follows_the_share_of_the_cache_read() -> None:
    config = MockerConfig(
        num_kv_blocks=64,
        decode_ms_base=4.0,
        decode_ms_per_active_block=0.0,
        decode_ms_per_kv_usage=8.0,
        decode_ms_per_kv_usage_squared=-2.0,
    )

    quarter = StepShape(prefill_tokens=0, decode_seqs=3, active_decode_blocks=16)
    full = StepShape(prefill_tokens=0, decode_seqs=3, active_decode_blocks=100)

    assert simulated_step_ms(config, quarter) == 4.0 + 8.0 * 0.25 - 2.0 * 0.0625
    assert simulated_step_ms(config, full) == 10.0  # usage is capped at the whole cache


def test_a_squared_usage_term_may_not_outweigh_the_linear_one() -> None:
    with pytest.raises(ValueError, match="'decode_ms_per_kv_usage_squared' has value -3.0; "):
        MockerConfig(decode_ms_per_kv_usage=2.0, decode_ms_per_kv_usage_squared=-3.0)


class FakeClock:
    """A clock the test moves by hand; ``sleep`` moves it too and records the sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_step_lasts_its_model_time_with_the_host_work_inside_it(tokenizer: Any) -> None:
    clock = FakeClock()
    config = MockerConfig(num_kv_blocks=64, block_size=4, speedup_ratio=1.0, **TIMING)
    runner = SimulatedRunner(config, 100, (), sleep=clock.sleep, clock=clock)
    engine = mocker(tokenizer, **TIMING)
    engine.add_request(PROMPT, PARAMS)
    engine.step()  # a prefill first, so the next chunk is one decode row over 6 blocks
    chunks = engine.scheduler.schedule().chunks

    runner.start_step()
    clock.now += 0.0015  # 1.5 ms of scheduling
    runner.run(chunks)  # 4.5 ms of model time
    clock.now += 0.010  # 10 ms of host work: more than the next step's model time
    runner.run(chunks)
    runner.run(chunks)  # right after the last: sleeps all of it

    assert clock.sleeps == pytest.approx([0.003, 0.0045], rel=1e-9)
    assert runner.simulated_ms == 3 * 4.5


@pytest.mark.parametrize(
    ("speedup", "expected_s"), [(1.0, 0.125), (4.0, 0.03125), (0.0, 0.0), (math.inf, 0.0)]
)
def test_sleep_is_model_time_over_speedup(speedup: float, expected_s: float) -> None:
    assert sleep_seconds(MockerConfig(speedup_ratio=speedup), 125.0) == expected_s


def test_engine_accumulates_the_model_time_of_its_steps(tokenizer: Any) -> None:
    engine = mocker(tokenizer, speedup_ratio=math.inf, **TIMING)

    engine.generate([PROMPT], PARAMS)

    # Prefill of 20 tokens (0.5 * 400 + 2 * 20 = 240), then two decodes reading 6 blocks
    # each (3 + 0.25 * 6 = 4.5).
    assert engine.runner.simulated_ms == 249.0


def test_a_decode_burst_simulates_each_of_its_steps(tokenizer: Any) -> None:
    engine = mocker(tokenizer, speedup_ratio=math.inf, **TIMING)
    stream = engine.add_request(PROMPT, PARAMS)
    engine.step()  # the prefill: 240 ms, and the first token
    out = engine.scheduler.schedule()  # one decode row over 6 blocks

    burst = engine.runner.run_decode_burst(out.chunks, 3)

    assert [len(tokens) for tokens in burst] == [1, 1, 1]
    assert engine.runner.simulated_ms == 240.0 + 3 * 4.5
    assert len(stream.token_ids) == 1


# ---- tokens -----------------------------------------------------------------------------


def test_tokens_are_reproducible_per_request(tokenizer: Any) -> None:
    params = SamplingParams(max_tokens=8)
    seeded = SamplingParams(max_tokens=8, seed=7)

    first = run_all(mocker(tokenizer), [PROMPT], params, prefix="req")[0]
    replay = run_all(mocker(tokenizer), [PROMPT], params, prefix="req")[0]
    other = run_all(mocker(tokenizer), [PROMPT], params, prefix="other")[0]
    seeded_a = run_all(mocker(tokenizer), [PROMPT], seeded, prefix="a")[0]
    seeded_b = run_all(mocker(tokenizer, seed=5), [PROMPT], seeded, prefix="b")[0]

    assert len(first.token_ids) == 8
    assert replay.token_ids == first.token_ids
    assert other.token_ids != first.token_ids
    assert seeded_a.token_ids == seeded_b.token_ids


def test_eos_only_with_its_probability(tokenizer: Any) -> None:
    never = mocker(tokenizer, vocab_size=3).generate([[0, 1]], SamplingParams(max_tokens=50))[0]
    always = mocker(tokenizer, vocab_size=3, eos_probability=1.0)

    assert tokenizer.eos_token_id == 2
    assert set(never.token_ids) == {0, 1} and never.finish_reason == "length"
    eos = always.generate([[0, 1]], SamplingParams(max_tokens=50))[0]
    assert (eos.token_ids, eos.finish_reason) == ([2], "stop")


# ---- block accounting -------------------------------------------------------------------


def test_repeated_prompt_is_a_prefix_hit(tokenizer: Any) -> None:
    engine = mocker(tokenizer)

    first = engine.generate([PROMPT], PARAMS)[0]
    second = engine.generate([PROMPT], PARAMS)[0]

    assert first.usage is not None and first.usage.cached_tokens == 0
    # The last prompt token is always computed: 19 tokens -> 4 full blocks of 4 hit.
    assert second.usage is not None and second.usage.cached_tokens == 16
    stats = engine.stats()
    assert (stats.prefix_queried_tokens, stats.prefix_hit_tokens) == (40, 16)
    assert stats.num_free_kv_blocks == 64


def test_a_reset_prefix_cache_starts_the_next_prompt_cold(tokenizer: Any) -> None:
    engine = mocker(tokenizer)
    engine.generate([PROMPT], PARAMS)
    engine.kv_events.drain()

    assert engine.reset_prefix_cache()

    again = engine.generate([PROMPT], PARAMS)[0]
    assert again.usage is not None and again.usage.cached_tokens == 0
    # AllBlocksCleared first (the routers drop this engine's blocks), then the new store.
    events = [type(r.event).__name__ for r in engine.kv_events.drain()]
    assert events == ["AllBlocksCleared", "BlockStored"]
    assert engine.stats().num_cached_kv_blocks == 5


def test_no_reset_while_a_request_holds_blocks(tokenizer: Any) -> None:
    engine = mocker(tokenizer)
    engine.generate([PROMPT], PARAMS)
    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=100), "running")
    engine.step()

    assert not engine.reset_prefix_cache()  # nothing changed: the cache still hits
    engine.abort("running")
    engine.step()
    assert stream.usage is not None and stream.usage.cached_tokens == 16
    assert engine.stats().num_cached_kv_blocks == 5
    assert engine.reset_prefix_cache()
    assert engine.stats().num_cached_kv_blocks == 0


def test_kv_events_report_the_stored_blocks(tokenizer: Any) -> None:
    engine = mocker(tokenizer)

    engine.generate([PROMPT], PARAMS)  # 22 tokens computed: 5 full blocks

    expected: list[SequenceHash] = []
    for i in range(5):
        parent = expected[-1] if expected else None
        expected.append(chain_hash(parent, local_block_hash(PROMPT[4 * i : 4 * i + 4])))
    records = engine.kv_events.drain()
    # The prefill step's five blocks in one event (a block per event cost the router more
    # than the blocks themselves); the one decode step filled no block.
    assert [r.event_id for r in records] == [1]
    assert records[0].event == BlockStored.from_token_ids(
        tuple(expected), None, tuple(PROMPT[:20]), 4
    )


def test_abort_frees_every_block(tokenizer: Any) -> None:
    engine = mocker(tokenizer)
    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=100), "r")
    for _ in range(3):
        engine.step()
    assert engine.stats().num_free_kv_blocks == 64 - 6

    engine.abort("r")
    engine.step()

    assert stream.finish_reason == "abort"
    assert stream.usage is not None and stream.usage.completion_tokens == 3
    stats = engine.stats()
    assert (stats.num_free_kv_blocks, stats.kv_usage, stats.num_running) == (64, 0.0, 0)


def test_preemption_under_a_tiny_budget_completes_everything(tokenizer: Any) -> None:
    prompts = [list(range(100 * i, 100 * i + 8)) for i in range(1, 4)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    roomy = run_all(mocker(tokenizer), prompts, params)

    tiny = mocker(tokenizer, num_kv_blocks=8, max_model_len=32)  # 3 x 4 blocks do not fit
    squeezed = run_all(tiny, prompts, params)

    stats = tiny.stats()
    assert stats.num_preemptions > 0
    assert [s.finish_reason for s in squeezed] == ["length"] * 3
    assert (stats.num_free_kv_blocks, stats.num_running, stats.num_waiting) == (8, 0, 0)
    # Tokens are drawn per request, so preemption does not change them.
    assert [s.token_ids for s in squeezed] == [s.token_ids for s in roomy]
    assert [len(s.token_ids) for s in squeezed] == [8, 8, 8]


def test_thread_serves_requests_with_sleeping_steps(tokenizer: Any) -> None:
    engine = mocker(tokenizer, speedup_ratio=1000.0)
    outputs: list[str] = []
    engine.add_output_listener(lambda step: outputs.extend(o.request_id for o in step))
    engine.start()
    try:
        stream = engine.add_request(PROMPT, PARAMS, "r")
        stream.wait(timeout=10)
    finally:
        engine.shutdown()

    assert len(stream.token_ids) == 3
    assert outputs == ["r", "r", "r"]
    assert stream.received[-1].finish_reason is FinishReason.LENGTH


# ---- KV transfer shapes -----------------------------------------------------------------


def test_export_and_import_have_the_nominal_kv_shape(tokenizer: Any) -> None:
    engine = mocker(tokenizer)

    kv = engine.export_kv([0, 1])
    engine.import_kv([5, 6], kv)

    assert tuple(kv.shape) == (1, 2, 2, 4, 1, 1)
    with pytest.raises(ValueError, match=r"KV tensor has shape \(1, 2, 3, 4, 1, 1\); expected"):
        engine.import_kv([5, 6], torch.zeros(1, 2, 3, 4, 1, 1))


def test_stored_prefix_is_a_real_cache_entry(tokenizer: Any) -> None:
    engine = mocker(tokenizer)

    stored = engine.store_prefix(PROMPT, torch.zeros(1, 2, 3, 4, 1, 1))
    hit = engine.generate([PROMPT], PARAMS)[0]

    assert stored == 3
    assert engine.cached_prefix(PROMPT).num_blocks == 5  # 3 stored + 2 from the request
    assert hit.usage is not None and hit.usage.cached_tokens == 12


def test_mocker_is_an_engine(tokenizer: Any) -> None:
    engine = mocker(tokenizer, max_model_len=100)
    assert isinstance(engine, Engine)
    assert engine.max_model_len == 100
    assert mocker(tokenizer).max_model_len == 256  # the whole cache by default


# ---- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"num_kv_blocks": 0},
            "MockerConfig 'num_kv_blocks' has value 0; expected an integer >= 1",
        ),
        ({"block_size": -1}, "MockerConfig 'block_size' has value -1; expected an integer >= 1"),
        (
            {"num_kv_blocks": 4, "block_size": 4, "max_model_len": 17},
            "MockerConfig 'max_model_len' has value 17; expected an integer in [2, 16]",
        ),
        ({"speedup_ratio": -1.0}, "MockerConfig 'speedup_ratio' has value -1.0; expected"),
        ({"speedup_ratio": math.nan}, "MockerConfig 'speedup_ratio' has value nan; expected"),
        ({"decode_ms_base": math.inf}, "MockerConfig 'decode_ms_base' has value inf; expected"),
        (
            {"eos_probability": 1.5},
            "MockerConfig 'eos_probability' has value 1.5; expected a number in [0, 1]",
        ),
        ({"vocab_size": 1}, "MockerConfig 'vocab_size' has value 1; expected an integer >= 2"),
        (
            {"prefix_cache_protected_share": -0.5},
            "MockerConfig 'prefix_cache_protected_share' has value -0.5; expected a number in",
        ),
    ],
)
def test_config_errors_name_field_and_value(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as error:
        MockerConfig(**overrides)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize(("share", "cached"), [(0.5, 16), (0.0, 0)])
def test_a_reused_prefix_outlasts_prompts_seen_once(tokenizer: Any, share: float, cached: int):
    # 16 blocks of 4 tokens; each 17-token prompt and its 3 tokens take 5. The hot prompt
    # is served twice (its 4 full prompt blocks hit: reused), then four prompts seen once
    # need 20 blocks: under segmented LRU they evict each other and the blocks never hit,
    # under plain LRU (share 0) the hot prompt's too.
    engine = mocker(tokenizer, num_kv_blocks=16, prefix_cache_protected_share=share)
    hot = [100 + i for i in range(17)]
    engine.generate([hot], PARAMS)
    engine.generate([hot], PARAMS)
    for base in (1000, 2000, 3000, 4000):
        engine.generate([[base + i for i in range(17)]], PARAMS)

    again = engine.generate([hot], PARAMS)[0]

    assert again.usage is not None and again.usage.cached_tokens == cached


def test_prompt_outside_the_vocabulary_is_refused(tokenizer: Any) -> None:
    engine = mocker(tokenizer, vocab_size=100)
    with pytest.raises(ValueError, match=r"prompt token id 100 is outside the vocabulary"):
        engine.add_request([1, 100], PARAMS, "r")


def test_a_cache_dump_rebuilds_what_the_events_built(tokenizer: Any) -> None:
    from dynask.kv.hashing import block_hashes
    from dynask.kv.prefix_index import PrefixIndex

    engine = mocker(tokenizer, num_kv_blocks=12)  # small: later prompts evict earlier ones
    prompts = [[base + i for i in range(18)] for base in (1000, 2000, 3000)]
    prompts.append(prompts[0][:9] + [5000 + i for i in range(9)])  # shares 2 blocks
    run_all(engine, prompts, PARAMS)
    from_events, from_dump = PrefixIndex(), PrefixIndex()
    for record in engine.kv_events.drain():
        from_events.apply("a", record)

    from_dump.resync("a", engine.kv_cache_dump())

    assert engine.kv_block_size == 4
    assert from_dump.expected_event_id("a") == from_events.expected_event_id("a")
    assert from_dump.num_blocks("a") == from_events.num_blocks("a") == 12
    for prompt in prompts:
        hashes = [pair.local for pair in block_hashes(prompt, 4)]
        assert from_dump.find_matches(hashes) == from_events.find_matches(hashes)
