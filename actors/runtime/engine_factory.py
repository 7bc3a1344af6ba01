"""Which engine an actor runs: ``EngineSpec`` (what to build) and ``build_engine``.

Design decisions:

- ``EngineSpec`` is plain, frozen and picklable, so the control plane can store it and
  ship it to a Dask worker; it is validated when made (kind, file, argument names and
  types), so a bad deployment fails in the control plane, not later inside an actor.
  Value ranges are checked by each engine's own config (``EngineConfig``,
  ``MockerConfig``, ``VLLMArgs``), which name the field and the value; they are made
  once when the spec is, since that costs nothing.
- The known arguments of ``torch`` and ``mocker`` are the fields of their config
  dataclasses (read with ``get_type_hints``), so a new config field needs no change here.
- ``out=openai:URL`` keeps its URL in ``url`` (as ``out=python:FILE.py`` keeps its file
  in ``python_file``); it is checked when the spec is made, the server only when the
  engine is built (in the worker that will talk to it).
- Backends without weights (echo, mocker, python, openai) still speak a real tokenizer, taken
  from the model argument (the bundled SmolLM2 by default), so detokenization, stop
  strings and vocabulary checks behave as with the real model.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from dynask.actors.api.engine_protocol import Engine
from dynask.actors.backends.echo import EchoEngine
from dynask.actors.backends.mocker_config import MockerConfig
from dynask.actors.backends.openai_forward.args import ForwardArgs, api_base
from dynask.actors.backends.python_file import PythonEngine, load_generate
from dynask.actors.backends.vllm.args import VLLMArgs
from dynask.actors.engine.config import EngineConfig
from dynask.actors.models.model_source import resolve_model
from dynask.actors.models.tokenizer_folder import load_tokenizer

# Engines built at once in one worker (several actors) race in transformers' lazy imports
# ("cannot import name 'AutoTokenizer'"), as out=vllm found; tokenizers load one at a time.
_LOADING = threading.Lock()
KINDS = ("torch", "vllm", "echo", "mocker", "python", "openai")
TORCH_KINDS = ("torch", "vllm", "mocker")  # the engines that run torch in their worker
ENGINE_FORMS = "torch, vllm, echo, mocker, python:FILE.py, openai:URL"


def _config_args(config: type[Any], exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    hints = typing.get_type_hints(config)
    return {f.name: hints[f.name] for f in dataclasses.fields(config) if f.name not in exclude}


@functools.cache
def _known_args(kind: str) -> dict[str, Any]:
    if kind == "torch":
        return _config_args(EngineConfig, exclude=("model",))
    if kind == "mocker":
        return _config_args(MockerConfig)
    if kind == "vllm":
        return _config_args(VLLMArgs)
    if kind == "openai":
        return _config_args(ForwardArgs)
    return {"delay_s": float, "max_model_len": int} if kind == "echo" else {"max_model_len": int}


@dataclass(frozen=True)
class EngineSpec:
    """An engine to build: its kind, model (None = bundled SmolLM2) and arguments."""

    kind: str
    model: str | None = None
    python_file: str | None = None  # the user's file, for kind "python" only
    engine_args: dict[str, Any] = field(default_factory=dict)
    url: str | None = None  # the server's address, for kind "openai" only

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"EngineSpec 'kind' has value {self.kind!r}; expected one of {', '.join(KINDS)}"
            )
        if self.kind == "python" and not self.python_file:
            raise ValueError("out=python needs the user's file: write python:FILE.py")
        if self.kind != "python" and self.python_file is not None:
            raise ValueError(
                f"EngineSpec 'python_file' has value {self.python_file!r}, but only "
                f"out=python takes a file, not out={self.kind}"
            )
        if self.kind == "openai":
            if not self.url:
                raise ValueError("out=openai needs the server's address: write openai:URL")
            api_base(self.url)  # ValueError naming a malformed URL
        elif self.url is not None:
            raise ValueError(
                f"EngineSpec 'url' has value {self.url!r}, but only out=openai takes a URL, "
                f"not out={self.kind}"
            )
        object.__setattr__(self, "engine_args", dict(self.engine_args))
        for key, value in self.engine_args.items():
            _check_arg(self.kind, key, value)
        # Value ranges, named, before any worker starts (each config is cheap to make).
        if self.kind == "torch":
            EngineConfig(model=self.model, **self.engine_args)
        elif self.kind == "vllm":
            VLLMArgs(**self.engine_args)
        elif self.kind == "mocker":
            MockerConfig(**self.engine_args)
        elif self.kind == "openai":
            ForwardArgs(**self.engine_args)


def _check_arg(kind: str, key: str, value: object) -> None:
    known = _known_args(kind)
    if key not in known:
        raise ValueError(
            f"engine argument {key!r} is not known to out={kind}; "
            f"known: {', '.join(sorted(known)) or '(none)'}"
        )
    expected = known[key]
    if not _has_type(value, expected):
        raise ValueError(
            f"engine argument {key!r} of out={kind} has value {value!r} of type "
            f"{type(value).__name__}; expected {_type_name(expected)}"
        )


def _has_type(value: object, expected: Any) -> bool:
    if isinstance(expected, types.UnionType) or typing.get_origin(expected) is typing.Union:
        return any(_has_type(value, option) for option in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if isinstance(value, bool):  # bool is an int subclass, but never a count or a size
        return expected is bool
    if expected is float:
        return isinstance(value, int | float)
    return isinstance(value, expected)


def _type_name(expected: Any) -> str:
    if isinstance(expected, type):
        return expected.__name__
    return str(expected)


def parse_engine(text: str) -> tuple[str, str | None]:
    """``(kind, target)`` from CLI syntax: torch, vllm, echo, mocker, python:FILE.py or
    openai:URL; the target is the file or the URL (None for the others)."""
    kind, sep, target = text.strip().partition(":")
    if kind == "python":
        if not target:
            raise ValueError(
                f"engine {text!r} names no file; write python:FILE.py (valid: {ENGINE_FORMS})"
            )
        return kind, target
    if kind == "openai":
        if not target:
            raise ValueError(
                f"engine {text!r} names no server; write openai:URL, e.g. "
                f"openai:http://gpu-1:8000/v1 (valid: {ENGINE_FORMS})"
            )
        api_base(target)
        return kind, target
    if sep or kind not in KINDS:
        raise ValueError(f"engine {text!r} is not known; valid: {ENGINE_FORMS}")
    return kind, None


def prepare_model(model: str | None) -> None:
    """Resolves a model argument once, in the calling process: a bad path fails before
    any worker starts, and a GGUF file is converted here rather than by every worker at
    the same time (they find the conversion cached)."""
    resolve_model(model)


def build_engine(spec: EngineSpec) -> Engine:
    """Builds (but does not start) the engine ``spec`` describes."""
    if spec.kind == "torch":
        from dynask.actors.engine.engine import LLMEngine  # torch: only where it runs

        return LLMEngine(EngineConfig(model=spec.model, **spec.engine_args))
    if spec.kind == "vllm":
        # Imported here: vLLM is an optional extra (dynask[vllm]).
        from dynask.actors.backends.vllm.engine import VLLMEngine

        return VLLMEngine(VLLMArgs(**spec.engine_args), spec.model)
    if spec.kind == "openai":
        from dynask.actors.backends.openai_forward.engine import build_forward_engine

        args = ForwardArgs(**spec.engine_args)
        return build_forward_engine(str(spec.url), args, _tokenizer(spec.model))
    if spec.kind == "python":
        generate = load_generate(str(spec.python_file))  # a bad file fails before the tokenizer
        return PythonEngine(generate, _tokenizer(spec.model), **spec.engine_args)
    tokenizer = _tokenizer(spec.model)
    if spec.kind == "echo":
        return EchoEngine(tokenizer, **spec.engine_args)
    from dynask.actors.backends.mocker import build_mocker_engine

    return build_mocker_engine(MockerConfig(**spec.engine_args), tokenizer)


def _tokenizer(model: str | None) -> Any:
    with _LOADING:
        return load_tokenizer(resolve_model(model).folder)
