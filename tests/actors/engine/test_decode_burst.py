"""Decode bursts (several greedy decode steps per host sync) change no output.

On the CPU the runner steps a burst one forward pass at a time; on a GPU with CUDA graphs
it chains the replays on the device (tests/actors/engine/test_cuda_graphs.py). Either way
the engine applies a burst's tokens through the ordinary postprocess, which these tests
pin down: the same tokens, text, finish reasons and block accounting as single steps.
"""

from __future__ import annotations

from pathlib import Path

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.streams import RequestStream
from dynask.actors.engine.cuda.decode_burst import burst_steps
from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import hf_greedy, hf_model, make_engine, prompts_of_lengths

LENGTHS = [3, 17, 30, 9]


def _run(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]
) -> list[RequestStream]:
    streams = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    calls = 0
    while not all(s.finished for s in streams):
        engine.step()
        calls += 1
    engine.step_calls = calls  # type: ignore[attr-defined]
    return streams


def _greedy(max_tokens: int, **extra: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


def test_bursts_match_single_steps_and_hf(tiny_llama_folder: Path) -> None:
    # block_size 4: bursts of 4 cross block boundaries; max_tokens differ so rows leave
    # mid-burst and later bursts are cut to what is left.
    prompts = prompts_of_lengths(LENGTHS, seed=3)
    params = [_greedy(9 + 2 * i) for i in range(len(prompts))]
    single = make_engine(tiny_llama_folder, block_size=4, decode_burst=1)
    # Asynchronous scheduling on, as on CUDA by default: the prefill steps then stay
    # synchronous, so the decode steps after them are scheduled as bursts.
    burst = make_engine(tiny_llama_folder, block_size=4, decode_burst=4, async_scheduling=True)

    expected = [s.token_ids for s in _run(single, prompts, params)]
    got = _run(burst, prompts, params)

    assert [s.token_ids for s in got] == expected
    assert [len(t) for t in expected] == [9, 11, 13, 15]
    reference = hf_model(tiny_llama_folder)
    assert expected == [
        hf_greedy(reference, p, sp.max_tokens) for p, sp in zip(prompts, params, strict=True)
    ]
    # The same number of model steps, in fewer calls: the bursts ran.
    assert burst.stats().num_steps == single.stats().num_steps
    assert burst.step_calls < single.step_calls / 2  # type: ignore[attr-defined]


def test_a_stop_token_inside_a_burst_ends_the_request_there(tiny_llama_folder: Path) -> None:
    prompt = prompts_of_lengths([21], seed=4)[0]
    free_run = _run(make_engine(tiny_llama_folder, decode_burst=1), [prompt], [_greedy(16)])
    tokens = free_run[0].token_ids
    stop_at = next(i for i in range(5, 16) if tokens[i] not in tokens[:i])
    params = _greedy(16, stop_token_ids=(tokens[stop_at],))

    engine = make_engine(tiny_llama_folder, decode_burst=8)
    stream = _run(engine, [prompt], [params])[0]

    assert stream.token_ids == tokens[: stop_at + 1]
    assert stream.finish_reason == "stop"
    pool = engine.parts.kv_manager.pool
    assert pool.num_free_blocks == pool.num_blocks  # the burst's spare blocks came back


def test_stop_strings_and_deltas_are_the_same_with_bursts(tiny_llama_folder: Path) -> None:
    prompts = prompts_of_lengths([12, 25], seed=9)
    single = _run(make_engine(tiny_llama_folder, decode_burst=1), prompts, [_greedy(14)] * 2)
    text = single[1].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = [_greedy(14, stop=(stop,))] * 2

    plain = _run(make_engine(tiny_llama_folder, decode_burst=1), prompts, params)
    bursts = _run(make_engine(tiny_llama_folder, decode_burst=6), prompts, params)

    assert [s.text for s in bursts] == [s.text for s in plain]
    assert [s.finish_reason for s in bursts] == [s.finish_reason for s in plain]
    for stream in bursts:  # the deltas add up to the whole output, in order
        assert [t for out in stream.received for t in out.token_ids] == stream.token_ids
        assert "".join(out.text for out in stream.received) == stream.text


def test_burst_length_rules(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, decode_burst=8, num_kv_blocks=64)
    greedy, sampled = _greedy(5), SamplingParams(max_tokens=40, temperature=0.7, seed=1)
    engine.add_request(prompts_of_lengths([10], seed=1)[0], greedy)
    engine.step()  # the prefill step, sampling the first token
    out = engine.scheduler.schedule()
    kv = engine.parts.kv_manager
    # 4 tokens are left of max_tokens=5: the burst is cut to them.
    assert burst_steps(out, kv, limit=8, max_model_len=engine.max_model_len) == 4
    assert burst_steps(out, kv, limit=1, max_model_len=engine.max_model_len) == 1

    engine.add_request(prompts_of_lengths([10], seed=2)[0], sampled)
    engine.step()
    mixed = engine.scheduler.schedule()
    assert burst_steps(mixed, kv, limit=8, max_model_len=engine.max_model_len) == 1


def test_no_burst_when_its_blocks_cannot_be_reserved(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, decode_burst=8, num_kv_blocks=8)
    stream = engine.add_request(prompts_of_lengths([15], seed=2)[0], _greedy(12))
    engine.step()  # prefill: 16 tokens with the first sampled one, one block
    out = engine.scheduler.schedule()  # the decode token at position 15 still fits it
    pool = engine.parts.kv_manager.pool
    others = pool.allocate(pool.num_free_blocks)  # somebody else holds every other block

    steps = burst_steps(out, engine.parts.kv_manager, limit=8, max_model_len=256)

    assert steps == 1
    pool.free_request_blocks(others)
    while not stream.finished:  # single steps, then bursts again, to the end
        engine.step()
    assert len(stream.token_ids) == 12
