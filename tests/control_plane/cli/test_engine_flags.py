"""``dynask run``'s engine flags become engine arguments only when given."""

from __future__ import annotations

import argparse

import pytest

from dynask.actors.engine.config import EngineConfig
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.cli.engine_flags import add_engine_flags, engine_args


def _engine_args(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    return engine_args(parser.parse_args(argv))


def test_cuda_fast_paths_are_the_configs_default_unless_a_flag_is_given() -> None:
    assert _engine_args([]) == {}
    assert EngineConfig().cuda_fast_paths is True


def test_no_cuda_fast_paths_turns_them_off() -> None:
    args = _engine_args(["--no-cuda-fast-paths"])
    assert args == {"cuda_fast_paths": False}
    assert EngineConfig(**args).cuda_fast_paths is False  # type: ignore[arg-type]
    assert EngineSpec("torch", engine_args=args).engine_args == args


def test_cuda_fast_paths_flag_turns_them_on() -> None:
    args = _engine_args(["--cuda-fast-paths"])
    assert args == {"cuda_fast_paths": True}
    assert EngineConfig(**args).cuda_fast_paths is True  # type: ignore[arg-type]


def test_cuda_fast_paths_takes_no_value() -> None:
    with pytest.raises(SystemExit):
        _engine_args(["--cuda-fast-paths", "yes"])


def test_the_protected_share_flag_reaches_the_engine_and_the_mocker() -> None:
    args = _engine_args(["--prefix-cache-protected-share", "0"])
    assert args == {"prefix_cache_protected_share": 0.0}
    assert EngineConfig(**args).prefix_cache_protected_share == 0.0  # type: ignore[arg-type]
    for kind in ("torch", "mocker"):
        assert EngineSpec(kind, engine_args=args).engine_args == args


def test_a_protected_share_out_of_range_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'prefix_cache_protected_share' has value 2.0"):
        EngineSpec("mocker", engine_args={"prefix_cache_protected_share": 2.0})
