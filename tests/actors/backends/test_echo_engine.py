"""``EchoEngine``: the prompt comes back token for token, under the built-in stop rules."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynask.actors.api.engine_protocol import Engine
from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.backends.echo import EchoEngine
from dynask.actors.models.tokenizer_folder import load_tokenizer

TEXT = "Hello world, this is a test. Stop here please."


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder: Path) -> Any:
    return load_tokenizer(smollm2_folder)


@pytest.fixture
def engine(tokenizer: Any) -> Iterator[EchoEngine]:
    engine = EchoEngine(tokenizer)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompt(tokenizer: Any) -> list[int]:
    ids = [int(t) for t in tokenizer.encode(TEXT)]
    assert len(ids) == 12
    return ids


def test_echo_is_an_engine(engine: EchoEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.kv_events.drain() == []


def test_streams_the_prompt_back_on_its_thread(engine: EchoEngine, prompt: list[int]) -> None:
    engine.start()
    stream = engine.add_request(prompt, SamplingParams(max_tokens=100), "r1")
    stream.wait(timeout=10)

    assert stream.token_ids == prompt
    assert stream.text == TEXT
    assert stream.finish_reason == "stop"
    assert stream.usage == Usage(prompt_tokens=12, completion_tokens=12, cached_tokens=0)
    assert [len(d.token_ids) for d in stream.received] == [1] * 12


def test_one_listener_call_per_step_with_every_delta(engine: EchoEngine) -> None:
    calls: list[list[RequestOutput]] = []
    engine.add_output_listener(calls.append)
    engine.add_request([100, 200, 300], SamplingParams(max_tokens=10), "a")
    engine.add_request([400], SamplingParams(max_tokens=10), "b")

    for _ in range(4):
        engine.step()

    assert [[(d.request_id, d.token_ids) for d in call] for call in calls] == [
        [("a", (100,)), ("b", (400,))],
        [("a", (200,))],
        [("a", (300,))],
    ]
    assert calls[0][1].usage == Usage(1, 1, 0)
    assert calls[2][0].finish_reason is FinishReason.STOP
    stats = engine.stats()
    assert (stats.num_steps, stats.prompt_tokens, stats.generated_tokens) == (3, 4, 4)
    assert stats.num_running == 0


def test_max_tokens_ends_with_length(engine: EchoEngine, prompt: list[int], tokenizer: Any) -> None:
    stream = engine.add_request(prompt, SamplingParams(max_tokens=5), "r")
    while not stream.finished:
        engine.step()

    assert stream.token_ids == prompt[:5]
    assert stream.text == tokenizer.decode(prompt[:5])
    assert stream.finish_reason == "length"
    assert stream.usage == Usage(12, 5, 0)


def test_stop_string_truncates_and_is_never_streamed(engine: EchoEngine, prompt: list[int]) -> None:
    stream = engine.add_request(prompt, SamplingParams(max_tokens=100, stop=(" Stop",)), "r")
    while not stream.finished:
        engine.step()

    assert stream.text == "Hello world, this is a test."
    assert stream.finish_reason == "stop"
    assert stream.received[-1].stop_reason == " Stop"
    assert all("Stop" not in d.text for d in stream.received)
    assert stream.token_ids == prompt[:9]  # the token that completed the stop string is kept


def test_stop_token_id_ends_the_request(engine: EchoEngine, prompt: list[int]) -> None:
    stream = engine.add_request(prompt, SamplingParams(stop_token_ids=(prompt[3],)), "r")
    while not stream.finished:
        engine.step()

    assert stream.token_ids == prompt[:4]
    assert stream.received[-1].stop_reason == prompt[3]


def test_abort_ends_the_request_with_abort(engine: EchoEngine, prompt: list[int]) -> None:
    stream = engine.add_request(prompt, SamplingParams(max_tokens=100), "r")
    engine.step()
    engine.step()
    engine.abort("r")
    engine.abort("unknown")
    outputs = engine.step()

    assert [(o.request_id, o.finish_reason) for o in outputs] == [("r", FinishReason.ABORT)]
    assert stream.token_ids == prompt[:2]
    assert stream.usage == Usage(12, 2, 0)
    assert engine.stats().num_running == 0


def test_context_length_ends_the_request(tokenizer: Any) -> None:
    engine = EchoEngine(tokenizer, max_model_len=6)
    stream = engine.add_request([10, 11, 12, 13], SamplingParams(max_tokens=100), "r")
    while not stream.finished:
        engine.step()

    assert stream.token_ids == [10, 11]
    assert stream.finish_reason == "length"


def test_delay_between_tokens_still_finishes(tokenizer: Any, prompt: list[int]) -> None:
    engine = EchoEngine(tokenizer, delay_s=0.001)
    engine.start()
    try:
        stream = engine.add_request(prompt, SamplingParams(max_tokens=3), "r")
        stream.wait(timeout=10)
    finally:
        engine.shutdown()

    assert stream.token_ids == prompt[:3]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "the prompt is empty; send at least one token"),
        ([1, 49152], r"prompt token id 49152 is outside the vocabulary \[0, 49152\)"),
        ([1] * 8, "the prompt has 8 tokens, but this engine's context is 8 tokens"),
    ],
)
def test_bad_prompts_are_refused(tokenizer: Any, prompt: list[int], message: str) -> None:
    engine = EchoEngine(tokenizer, max_model_len=8)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, SamplingParams(), "r")


def test_bad_settings_name_the_field(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match=r"EchoEngine 'delay_s' has value -1\.0; expected"):
        EchoEngine(tokenizer, delay_s=-1.0)
    with pytest.raises(ValueError, match="EchoEngine 'max_model_len' has value 1; expected"):
        EchoEngine(tokenizer, max_model_len=1)


def test_a_failing_listener_aborts_in_flight_and_keeps_the_thread(
    engine: EchoEngine, caplog: pytest.LogCaptureFixture
) -> None:
    failures = [RuntimeError("listener broke")]

    def flaky(outputs: list[RequestOutput]) -> None:
        if failures:
            raise failures.pop()

    engine.add_output_listener(flaky)
    engine.start()
    with caplog.at_level(logging.ERROR, logger="dynask.actors.backends.echo"):
        first = engine.add_request([100, 200], SamplingParams(), "first")
        first.wait(timeout=10)
    second = engine.add_request([300], SamplingParams(), "second")
    second.wait(timeout=10)

    assert first.finish_reason == "abort"
    assert "echo step failed" in caplog.text
    assert (second.token_ids, second.finish_reason) == ([300], "stop")
