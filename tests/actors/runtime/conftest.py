"""Fixtures of the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import make_engine


@pytest.fixture(scope="package")
def llama_engines(tiny_llama_folder: Path) -> Iterator[list[LLMEngine]]:
    """Three started tiny-Llama engines (aggregated, prefill, decode), block size 8, shared
    by the KV transfer tests of this package (each uses prompts of its own, so no test
    finds another's blocks cached)."""
    engines = [make_engine(tiny_llama_folder, block_size=8) for _ in range(3)]
    for engine in engines:
        engine.start()
    yield engines
    for engine in engines:
        engine.shutdown()
