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


def test_unverified_cuda_kernels_is_off_unless_the_flag_is_given() -> None:
    assert _engine_args([]) == {}
    assert EngineConfig().unverified_cuda_kernels is False
    args = _engine_args(["--unverified-cuda-kernels"])
    assert args == {"unverified_cuda_kernels": True}
    assert EngineConfig(**args).unverified_cuda_kernels is True  # type: ignore[arg-type]
    assert EngineSpec("torch", engine_args=args).engine_args == args


def test_unverified_cuda_kernels_takes_no_value() -> None:
    with pytest.raises(SystemExit):
        _engine_args(["--unverified-cuda-kernels", "yes"])
