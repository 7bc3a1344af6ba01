"""Session-wide ``dynask run`` servers over the tiny Llama model, shared by the modules
that need a real server but nothing of their own in it (each start is a process with its
worker processes: seconds of imports on two cores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control_plane import server_process as sp


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The built-in engine, two worker processes."""
    folder = tmp_path_factory.mktemp("server")
    args = [str(tiny_llama_folder), "--model-name", "tiny", "--workers", "2"]
    with sp.dynask_run(folder, [*args, "--kv-cache-gib", "0.05"]) as (base, _):
        sp.wait_for_engines(base, 2)
        yield base


@pytest.fixture(scope="session")
def echo_server(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``out=echo`` served as ``tiny`` (the tiny Llama's tokenizer), one worker process:
    an engine that answers at once, for tests of the HTTP layer and of echo's refusals."""
    folder = tmp_path_factory.mktemp("echo-server")
    args = [str(tiny_llama_folder), "out=echo", "--model-name", "tiny", "--workers", "1"]
    with sp.dynask_run(folder, args) as (base, _):
        sp.wait_for_engines(base, 1)
        yield base
