"""``PythonEngine``: a user's ``async def generate`` as an engine (pystr and pytok)."""

from __future__ import annotations

import logging
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynask.actors.api.engine_protocol import Engine
from dynask.actors.api.outputs import RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.backends.python_file import PythonEngine, load_generate
from dynask.actors.models.tokenizer_folder import load_tokenizer

PROMPT = [19556, 905, 28, 451]  # "Hello world, this"

PYSTR = """
async def generate(request):
    for word in ["Hello", " from", " Python"]:
        yield word
"""

PYTOK = """
async def generate(request):
    yield request.prompt_token_ids[0]
    yield list(request.prompt_token_ids[1:])
"""

CLOSABLE = """
import asyncio

events = []

async def generate(request):
    try:
        yield [1000, 1001, 1002, 1003, 1004, 1005]
        yield "never reached"
        await asyncio.sleep(3600)
    finally:
        events.append(("closed", request.request_id))
"""

RAISES = """
async def generate(request):
    yield "partial"
    raise RuntimeError("the user's code failed")
"""

ECHO_REQUEST = """
async def generate(request):
    yield request.prompt_text
    yield f"|{request.request_id}|{request.params.max_tokens}"
"""


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder: Path) -> Any:
    return load_tokenizer(smollm2_folder)


@pytest.fixture
def make(tmp_path: Path, tokenizer: Any) -> Iterator[Any]:
    """Writes a user file and returns a started engine serving it."""
    engines: list[PythonEngine] = []

    def make_engine(source: str, name: str = "user_engine.py") -> PythonEngine:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        engine = PythonEngine.from_file(path, tokenizer)
        engine.start()
        engines.append(engine)
        return engine

    yield make_engine
    for engine in engines:
        engine.shutdown()


def deltas_arrived(engine: PythonEngine, count: int) -> threading.Event:
    """An event set once the engine has published ``count`` deltas."""
    seen: list[RequestOutput] = []
    arrived = threading.Event()

    def listen(outputs: list[RequestOutput]) -> None:
        seen.extend(outputs)
        if len(seen) >= count:
            arrived.set()

    engine.add_output_listener(listen)
    return arrived


def test_pystr_yields_text_deltas(make: Any) -> None:
    engine = make(PYSTR)
    calls: list[list[RequestOutput]] = []
    engine.add_output_listener(calls.append)

    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=10), "r")
    stream.wait(timeout=10)

    assert isinstance(engine, Engine)
    assert [d.text for d in stream.received] == ["Hello", " from", " Python", ""]
    assert stream.token_ids == []
    assert stream.finish_reason == "stop"
    assert stream.usage == Usage(prompt_tokens=4, completion_tokens=3, cached_tokens=0)
    assert [len(call) for call in calls] == [1, 1, 1, 1]


def test_pytok_yields_token_ids_we_detokenize(make: Any, tokenizer: Any) -> None:
    engine = make(PYTOK)

    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=10), "r")
    stream.wait(timeout=10)

    assert [d.token_ids for d in stream.received] == [(19556,), (905, 28, 451), ()]
    assert stream.text == "Hello world, this"
    assert stream.usage == Usage(4, 4, 0)
    assert engine.stats().generated_tokens == 4


def test_request_carries_prompt_text_params_and_id(make: Any, tokenizer: Any) -> None:
    engine = make(ECHO_REQUEST)

    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=7), "req-9")
    stream.wait(timeout=10)

    assert stream.text == "Hello world, this|req-9|7"


def test_max_tokens_truncates_and_closes_the_generator(make: Any) -> None:
    engine = make(CLOSABLE)
    calls: list[list[RequestOutput]] = []
    engine.add_output_listener(calls.append)

    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=4), "r")
    stream.wait(timeout=10)
    engine.shutdown()  # lets anything still queued reach the listener

    assert [[d.finished for d in call] for call in calls] == [[True]]  # one final delta
    assert stream.token_ids == [1000, 1001, 1002, 1003]
    assert stream.finish_reason == "length"
    assert stream.usage == Usage(4, 4, 0)
    assert engine.generate.__globals__["events"] == [("closed", "r")]


def test_stop_string_across_text_items(make: Any) -> None:
    engine = make(PYSTR)

    stream = engine.add_request(PROMPT, SamplingParams(stop=("o f",)), "r")
    stream.wait(timeout=10)

    assert stream.text == "Hell"
    assert stream.received[-1].stop_reason == "o f"
    assert all("o f" not in d.text for d in stream.received)


def test_stop_token_id_ends_a_token_list(make: Any) -> None:
    engine = make(PYTOK)

    stream = engine.add_request(PROMPT, SamplingParams(stop_token_ids=(28,)), "r")
    stream.wait(timeout=10)

    assert stream.token_ids == [19556, 905, 28]
    assert stream.received[-1].stop_reason == 28


def test_abort_cancels_the_task(make: Any) -> None:
    engine = make(CLOSABLE)
    asleep = deltas_arrived(engine, 2)  # the tokens and the text; then it sleeps

    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=100), "r")
    assert asleep.wait(timeout=10)
    engine.abort("r")
    engine.abort("unknown")
    stream.wait(timeout=10)

    assert stream.finish_reason == "abort"
    assert stream.token_ids == [1000, 1001, 1002, 1003, 1004, 1005]
    assert stream.usage == Usage(4, 7, 0)  # 6 tokens and one text item
    assert engine.generate.__globals__["events"] == [("closed", "r")]
    assert engine.stats().num_running == 0


def test_exception_in_user_code_aborts_that_request(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make(RAISES)

    with caplog.at_level(logging.ERROR, logger="dynask.actors.backends.python_file"):
        stream = engine.add_request(PROMPT, SamplingParams(), "bad")
        stream.wait(timeout=10)
    healthy = make(PYSTR, "other.py").add_request(PROMPT, SamplingParams(), "good")
    healthy.wait(timeout=10)

    assert stream.text == "partial"
    assert stream.finish_reason == "abort"
    assert stream.received[-1].error == "RuntimeError: the user's code failed"
    assert "generate() failed for request bad" in caplog.text
    assert healthy.finish_reason == "stop"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("3.5", "TypeError: generate() yielded 3.5 of type float; yield a str (text), or an int"),
        ("[1, 49152]", "TypeError: generate() yielded [1, 49152] of type list;"),
        ("True", "TypeError: generate() yielded True of type bool;"),
    ],
)
def test_bad_items_end_the_request_with_an_error(make: Any, item: str, message: str) -> None:
    engine = make(f"async def generate(request):\n    yield {item}\n")

    stream = engine.add_request(PROMPT, SamplingParams(), "r")
    stream.wait(timeout=10)

    error = stream.received[-1].error
    assert stream.finish_reason == "abort"
    assert error is not None and error.startswith(message)


def test_shutdown_drops_requests_in_flight(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "slow.py"
    path.write_text(textwrap.dedent(CLOSABLE))
    engine = PythonEngine.from_file(path, tokenizer)
    asleep = deltas_arrived(engine, 2)
    engine.start()
    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=100), "r")
    assert asleep.wait(timeout=10)

    engine.shutdown()

    assert not stream.finished
    assert engine.generate.__globals__["events"] == [("closed", "r")]
    with pytest.raises(RuntimeError, match="was shut down"):
        engine.add_request(PROMPT, SamplingParams(), "again")


def test_bad_prompt_is_refused(make: Any) -> None:
    with pytest.raises(ValueError, match="the prompt is empty"):
        make(PYSTR).add_request([], SamplingParams(), "r")


# ---- loading errors ---------------------------------------------------------------------


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError, match=f"python engine file '{missing}' does not exist"):
        load_generate(missing)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = 1\n", "defines no 'generate'"),
        ("def generate(request):\n    yield 'x'\n", "is not an async generator function"),
        ("async def generate(request):\n    return 'x'\n", "is not an async generator function"),
        ("generate = 3\n", "is not an async generator function"),
    ],
)
def test_file_without_an_async_generator_is_refused(
    tmp_path: Path, source: str, message: str
) -> None:
    path = tmp_path / "user.py"
    path.write_text(source)
    with pytest.raises(ValueError, match=message) as error:
        load_generate(path)
    assert str(path) in str(error.value)
