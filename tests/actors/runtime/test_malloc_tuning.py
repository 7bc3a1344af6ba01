"""The engine process's malloc settings apply on this (glibc) machine."""

from __future__ import annotations

import platform

import pytest

from dynask.actors.runtime.malloc_tuning import keep_tensor_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_thresholds_are_raised_on_glibc() -> None:
    assert keep_tensor_memory() is True
