"""``EngineSpec`` validation, ``parse_engine`` and ``build_engine`` for every kind."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from dynask.actors.api.engine_protocol import Engine
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.backends.echo import EchoEngine
from dynask.actors.backends.mocker import MockerEngine
from dynask.actors.backends.python_file import PythonEngine
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.runtime.engine_factory import EngineSpec, build_engine, parse_engine

# ---- parse_engine -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("torch", ("torch", None)),
        ("echo", ("echo", None)),
        ("mocker", ("mocker", None)),
        ("python:my_engine.py", ("python", "my_engine.py")),
        ("python:/abs/path:with:colons.py", ("python", "/abs/path:with:colons.py")),
    ],
)
def test_parse_engine_accepts_the_valid_forms(text: str, parsed: tuple[str, str | None]) -> None:
    assert parse_engine(text) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sglang",
            "engine 'sglang' is not known; valid: torch, vllm, echo, mocker, python:FILE.py, "
            "openai:URL",
        ),
        (
            "echo:x.py",
            "engine 'echo:x.py' is not known; valid: torch, vllm, echo, mocker, python:FILE.py, "
            "openai:URL",
        ),
        (
            "python",
            "engine 'python' names no file; write python:FILE.py "
            "(valid: torch, vllm, echo, mocker, python:FILE.py, "
            "openai:URL)",
        ),
        ("python:", "engine 'python:' names no file; write python:FILE.py"),
    ],
)
def test_parse_engine_lists_the_valid_forms(text: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_engine(text)
    assert str(error.value).startswith(message)


# ---- EngineSpec -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "tensorrt"}, "EngineSpec 'kind' has value 'tensorrt'; expected one of "),
        ({"kind": "python"}, "out=python needs the user's file: write python:FILE.py"),
        (
            {"kind": "echo", "python_file": "x.py"},
            "EngineSpec 'python_file' has value 'x.py', but only out=python takes a file, "
            "not out=echo",
        ),
        (
            {"kind": "echo", "engine_args": {"foo": 1}},
            "engine argument 'foo' is not known to out=echo; known: delay_s, max_model_len",
        ),
        (
            {"kind": "python", "python_file": "x.py", "engine_args": {"delay_s": 1.0}},
            "engine argument 'delay_s' is not known to out=python; known: max_model_len",
        ),
        (
            {"kind": "mocker", "engine_args": {"num_kv_blocks": "8"}},
            "engine argument 'num_kv_blocks' of out=mocker has value '8' of type str; expected int",
        ),
        (
            {"kind": "mocker", "engine_args": {"enable_prefix_caching": 1}},
            "engine argument 'enable_prefix_caching' of out=mocker has value 1 of type int; "
            "expected bool",
        ),
        (
            {"kind": "mocker", "engine_args": {"max_num_seqs": True}},
            "engine argument 'max_num_seqs' of out=mocker has value True of type bool; "
            "expected int",
        ),
        (
            {"kind": "torch", "engine_args": {"num_kv_blocks": 1.5}},
            "engine argument 'num_kv_blocks' of out=torch has value 1.5 of type float; "
            "expected int | None",
        ),
        (
            {"kind": "torch", "engine_args": {"model": "x"}},
            "engine argument 'model' is not known to out=torch; known: async_scheduling, "
            "block_size, ",
        ),
    ],
)
def test_bad_specs_are_refused_with_clear_messages(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as error:
        EngineSpec(**kwargs)
    assert str(error.value).startswith(message)


def test_mocker_lists_its_known_arguments() -> None:
    with pytest.raises(ValueError) as error:
        EngineSpec("mocker", engine_args={"foo": 1})
    known = str(error.value).split("known: ")[1].split(", ")
    assert known == sorted(known)
    assert {"num_kv_blocks", "speedup_ratio", "decode_ms_per_active_block", "seed"} <= set(known)


def test_good_specs_accept_ints_for_floats_and_none_for_optionals() -> None:
    spec = EngineSpec(
        "mocker", engine_args={"speedup_ratio": 10, "vocab_size": None, "eos_probability": 0.5}
    )
    args: dict[str, Any] = {"speedup_ratio": 10, "vocab_size": None, "eos_probability": 0.5}
    assert spec.engine_args == args
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_spec_keeps_its_own_copy_of_the_arguments() -> None:
    args: dict[str, Any] = {"delay_s": 0.5}
    spec = EngineSpec("echo", engine_args=args)
    args["delay_s"] = "changed"
    assert spec.engine_args == {"delay_s": 0.5}


# ---- build_engine -----------------------------------------------------------------------


def test_builds_an_echo_engine_with_the_bundled_tokenizer() -> None:
    engine = build_engine(EngineSpec("echo", engine_args={"max_model_len": 64}))

    assert isinstance(engine, EchoEngine) and isinstance(engine, Engine)
    assert engine.max_model_len == 64
    stream = engine.add_request([19556, 905], SamplingParams(), "r")
    while not stream.finished:
        engine.step()
    assert stream.text == "Hello world"


def test_builds_a_mocker_engine(smollm2_folder: Path) -> None:
    spec = EngineSpec(
        "mocker",
        model=str(smollm2_folder),
        engine_args={"num_kv_blocks": 32, "block_size": 8, "speedup_ratio": 0},
    )

    engine = build_engine(spec)

    assert isinstance(engine, MockerEngine) and isinstance(engine, Engine)
    assert engine.max_model_len == 256
    assert engine.stats().num_kv_blocks == 32


def test_mocker_values_are_checked_by_its_config() -> None:
    # checked when the spec is made (the admin form and deploy.yaml fail early), not later
    with pytest.raises(ValueError, match="MockerConfig 'num_kv_blocks' has value 0; expected"):
        EngineSpec("mocker", engine_args={"num_kv_blocks": 0})


def test_builds_a_python_engine(tmp_path: Path) -> None:
    path = tmp_path / "engine.py"
    path.write_text("async def generate(request):\n    yield 'hi'\n")

    engine = build_engine(EngineSpec("python", python_file=str(path)))

    assert isinstance(engine, PythonEngine) and isinstance(engine, Engine)
    engine.start()
    try:
        stream = engine.add_request([1, 2], SamplingParams(), "r")
        stream.wait(timeout=10)
    finally:
        engine.shutdown()
    assert stream.text == "hi"


def test_python_engine_with_a_missing_file_fails_clearly(tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    with pytest.raises(FileNotFoundError, match=f"python engine file '{missing}' does not exist"):
        build_engine(EngineSpec("python", python_file=str(missing)))


def test_builds_the_torch_engine(tiny_llama_folder: Path) -> None:
    spec = EngineSpec(
        "torch",
        model=str(tiny_llama_folder),
        engine_args={"device": "cpu", "num_kv_blocks": 16, "block_size": 16},
    )

    engine = build_engine(spec)

    assert isinstance(engine, LLMEngine) and isinstance(engine, Engine)
    assert engine.max_model_len == 256  # 16 blocks x 16 tokens, below the model's 512
