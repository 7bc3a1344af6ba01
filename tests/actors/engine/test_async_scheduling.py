"""Asynchronous scheduling (the next decode step launched before this one is applied)
changes no output.

On the CPU the runner computes each launched step at once, so these tests pin down the
engine's side: which step is in flight, the tokens dropped for rows that stopped, the
blocks reserved ahead and given back, the fall-back to synchronous steps when a request
arrives or a row needs its logits on the host. With ``DYNASK_TEST_DEVICE=cuda`` the same
tests run the CUDA-graph launches fed by the previous step's ids on the device.
"""

from __future__ import annotations

from pathlib import Path

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.streams import RequestStream
from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import hf_greedy, hf_model, make_engine, prompts_of_lengths

LENGTHS = [3, 17, 30, 9]


def _run(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]
) -> list[RequestStream]:
    streams = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    while not all(s.finished for s in streams):
        engine.step()
    return streams


def _greedy(max_tokens: int, **extra: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)


def _engines(folder: Path, **overrides: object) -> tuple[LLMEngine, LLMEngine]:
    sync = make_engine(folder, async_scheduling=False, **overrides)
    overlapped = make_engine(folder, async_scheduling=True, **overrides)
    assert sync.async_decodes is None and overlapped.async_decodes is not None
    return sync, overlapped


def _free_pool(engine: LLMEngine) -> None:
    pool = engine.parts.kv_manager.pool
    assert engine.async_decodes is None or engine.async_decodes.inflight is None
    assert pool.num_free_blocks == pool.num_blocks  # every block reserved ahead came back


def test_greedy_output_equals_synchronous_steps_and_hf(tiny_llama_folder: Path) -> None:
    # block_size 4: the slot reserved ahead crosses block boundaries; rows leave at
    # different max_tokens, so later steps run on fewer rows than the one before.
    prompts = prompts_of_lengths(LENGTHS, seed=3)
    params = [_greedy(9 + 2 * i) for i in range(len(prompts))]
    sync, overlapped = _engines(tiny_llama_folder, block_size=4)

    expected = [s.token_ids for s in _run(sync, prompts, params)]
    got = _run(overlapped, prompts, params)

    assert [s.token_ids for s in got] == expected
    assert [len(t) for t in expected] == [9, 11, 13, 15]
    reference = hf_model(tiny_llama_folder)
    assert expected == [
        hf_greedy(reference, p, sp.max_tokens) for p, sp in zip(prompts, params, strict=True)
    ]
    # No step in vain: a row whose max_tokens ends is left out of the step after it.
    assert overlapped.stats().num_steps == sync.stats().num_steps
    assert overlapped.stats().generated_tokens == sum(len(t) for t in expected)
    _free_pool(overlapped)


def test_a_stop_token_drops_the_step_launched_after_it(tiny_llama_folder: Path) -> None:
    prompts = prompts_of_lengths([21, 8], seed=4)
    sync, overlapped = _engines(tiny_llama_folder, block_size=4)
    free_run = _run(sync, prompts, [_greedy(16)] * 2)
    tokens = free_run[0].token_ids
    stop_at = next(i for i in range(5, 16) if tokens[i] not in tokens[:i])
    params = [_greedy(16, stop_token_ids=(tokens[stop_at],)), _greedy(16)]
    generated_before = sync.stats().generated_tokens

    expected = _run(sync, prompts, params)
    got = _run(overlapped, prompts, params)

    assert got[0].token_ids == tokens[: stop_at + 1] == expected[0].token_ids
    assert got[0].finish_reason == "stop"
    assert got[1].token_ids == expected[1].token_ids == free_run[1].token_ids
    for stream in got:  # one token per delta, in order, nothing after the stop
        assert all(len(out.token_ids) <= 1 for out in stream.received)
        assert [t for out in stream.received for t in out.token_ids] == stream.token_ids
    # The stopped row's step after the stop ran, and its token was dropped.
    assert overlapped.stats().generated_tokens == sync.stats().generated_tokens - generated_before
    _free_pool(overlapped)


def test_stop_strings_and_text_are_the_same(tiny_llama_folder: Path) -> None:
    prompts = prompts_of_lengths([12, 25], seed=9)
    sync, overlapped = _engines(tiny_llama_folder)
    text = _run(sync, prompts, [_greedy(14)] * 2)[1].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = [_greedy(14, stop=(stop,))] * 2

    plain = _run(sync, prompts, params)
    got = _run(overlapped, prompts, params)

    assert [s.text for s in got] == [s.text for s in plain]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in plain]
    for stream in got:
        assert "".join(out.text for out in stream.received) == stream.text


def test_seeded_sampled_rows_draw_what_synchronous_steps_draw(tiny_llama_folder: Path) -> None:
    # Sampled rows overlap too: the row's draw for the token in flight is seeded by its
    # position, so it is the draw a synchronous step makes there.
    prompts = prompts_of_lengths([7, 19, 11], seed=5)
    params = [
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=1.2, top_k=20, seed=12, ignore_eos=True),
        _greedy(12),
    ]
    sync, overlapped = _engines(tiny_llama_folder, block_size=4)

    expected = [s.token_ids for s in _run(sync, prompts, params)]
    got = [s.token_ids for s in _run(overlapped, prompts, params)]

    assert got == expected
    assert [len(t) for t in got] == [12, 10, 12]
    _free_pool(overlapped)


def test_an_arrival_and_an_abort_in_flight(tiny_llama_folder: Path) -> None:
    # A request arriving mid-decode makes the engine apply the step in flight, publish it
    # and run the scheduled (mixed) step in the same call; an abort while a step is in
    # flight drops the row's token.
    first, second, third = prompts_of_lengths([10, 14, 6], seed=8)
    sync, overlapped = _engines(tiny_llama_folder, block_size=4)
    outputs = {}
    for engine in (sync, overlapped):
        a = engine.add_request(first, _greedy(20))
        b = engine.add_request(second, _greedy(20))
        for _ in range(5):
            engine.step()
        assert len(a.token_ids) == len(b.token_ids) == 5
        if engine is overlapped:
            assert engine.async_decodes is not None and engine.async_decodes.inflight is not None
        c = engine.add_request(third, _greedy(8))
        engine.step()
        # sync: one mixed step; overlapped: the step in flight, then the mixed one
        # (synchronous: none in flight after it), each published on its own.
        ahead = int(engine is overlapped)
        assert len(a.token_ids) == len(b.token_ids) == 6 + ahead and len(c.token_ids) == 1
        assert all(len(out.token_ids) == 1 for out in a.received)
        if engine is overlapped:
            assert engine.async_decodes is not None and engine.async_decodes.inflight is None
        engine.abort(b.request_id)
        while not (a.finished and b.finished and c.finished):
            engine.step()
        outputs[engine is overlapped] = (a.token_ids, b.token_ids, c.token_ids, b.finish_reason)
        _free_pool(engine)

    a_tokens, b_tokens, c_tokens, b_reason = outputs[True]
    sync_a, sync_b, sync_c, _ = outputs[False]
    assert a_tokens == sync_a and c_tokens == sync_c
    assert len(a_tokens) == 20 and len(c_tokens) == 8 and b_reason == "abort"
    # b was aborted one step later in the overlapped engine: one token more, same prefix.
    assert b_tokens[:-1] == sync_b and len(b_tokens) == 7


def test_rows_needing_host_logits_run_synchronously(tiny_llama_folder: Path) -> None:
    # logprobs and penalties read the step's logits on the host: no step is launched
    # ahead while such a row runs, and the outputs are the synchronous ones.
    prompts = prompts_of_lengths([9, 13], seed=6)
    params = [_greedy(8, logprobs=2), _greedy(8, presence_penalty=0.5)]
    sync, overlapped = _engines(tiny_llama_folder)

    expected = _run(sync, prompts, params)
    streams = [overlapped.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    while not all(s.finished for s in streams):
        overlapped.step()
        assert overlapped.async_decodes is not None
        assert overlapped.async_decodes.inflight is None

    assert [s.token_ids for s in streams] == [s.token_ids for s in expected]
    assert [len(o.logprobs or ()) for o in streams[0].received] == [
        len(o.logprobs or ()) for o in expected[0].received
    ]


def test_it_is_on_by_default_only_on_cuda(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder)
    on_cuda = engine.parts.runner.device.type == "cuda"  # type: ignore[attr-defined]
    assert (engine.async_decodes is not None) == on_cuda
