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
    # and launch the scheduled (mixed) step in the same call, which the next call applies;
    # an abort while a step is in flight drops the row's token.
    first, second, third = prompts_of_lengths([10, 14, 6], seed=8)
    sync, overlapped = _engines(tiny_llama_folder, block_size=4)
    outputs = {}
    for engine in (sync, overlapped):
        a = engine.add_request(first, _greedy(20))
        b = engine.add_request(second, _greedy(20))
        for _ in range(5):
            engine.step()
        if engine is overlapped:
            assert engine.async_decodes is not None and engine.async_decodes.inflight is not None
        c = engine.add_request(third, _greedy(8))
        engine.step()
        assert len(a.token_ids) == len(b.token_ids) == 6
        if engine is overlapped:  # the mixed step (c's prefill beside a and b) is in flight
            assert engine.async_decodes is not None
            inflight = engine.async_decodes.inflight
            assert inflight is not None and len(inflight.chunks) == 3 and not c.token_ids
        engine.step()  # overlapped: applies the mixed step, launches the decode after it
        # c's first token: the sync engine's mixed step came a call earlier (no step was
        # in flight to apply first).
        assert len(a.token_ids) == len(b.token_ids) == 7
        assert len(c.token_ids) == (1 if engine is overlapped else 2)
        engine.abort(b.request_id)
        while not (a.finished and b.finished and c.finished):
            engine.step()
        outputs[engine is overlapped] = (a.token_ids, b.token_ids, c.token_ids, b.finish_reason)
        _free_pool(engine)

    # One step's tokens per call either way: the same tokens (b's abort at the same call).
    assert outputs[True] == outputs[False]
    a_tokens, b_tokens, c_tokens, b_reason = outputs[True]
    assert len(a_tokens) == 20 and len(c_tokens) == 8 and b_reason == "abort"
    assert 0 < len(b_tokens) < 20


def test_mixed_steps_launched_ahead_give_the_synchronous_tokens(tiny_llama_folder: Path) -> None:
    # Arrivals while decodes run, prompts longer than the step budget (prefilled in
    # chunks beside the decode rows) and seeded sampled rows: the mixed steps launched
    # without waiting, and the decode steps launched from their ids on the device, give
    # every request the tokens that synchronous steps give it.
    prompts = prompts_of_lengths([5, 21, 9, 4], seed=12)
    params = [
        _greedy(8),
        SamplingParams(max_tokens=6, temperature=0.8, top_k=30, seed=5, ignore_eos=True),
        _greedy(5),
        SamplingParams(max_tokens=5, temperature=1.1, top_p=0.8, seed=6, ignore_eos=True),
    ]
    arrivals = [0, 0, 2, 5]  # the call before which each request is added
    sync, overlapped = _engines(tiny_llama_folder, block_size=4, max_num_batched_tokens=12)
    runner = overlapped.parts.runner
    launched_mixed = []
    launch_step = runner.launch_step  # type: ignore[attr-defined]
    runner.launch_step = lambda chunks: launched_mixed.append(len(chunks)) or launch_step(chunks)  # type: ignore[attr-defined]
    results = []
    for engine in (sync, overlapped):
        streams: list[RequestStream] = []
        calls = 0
        while len(streams) < len(prompts) or not all(s.finished for s in streams):
            while len(streams) < len(prompts) and arrivals[len(streams)] <= calls:
                i = len(streams)
                streams.append(engine.add_request(prompts[i], params[i]))
            engine.step()
            calls += 1
        results.append([s.token_ids for s in streams])
        for stream in streams:  # one token per delta, in order
            assert all(len(out.token_ids) <= 1 for out in stream.received)
        _free_pool(engine)

    assert results[1] == results[0]
    assert [len(t) for t in results[0]] == [p.max_tokens for p in params]
    assert any(n > 1 for n in launched_mixed)  # prefill chunks beside decode rows, ahead


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
