"""A session-wide ``dynask run`` server over the tiny Llama model, two worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control_plane import server_process as sp


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("server")
    args = [str(tiny_llama_folder), "--model-name", "tiny", "--workers", "2"]
    with sp.dynask_run(folder, [*args, "--kv-cache-gib", "0.05"]) as (base, _):
        sp.wait_for_engines(base, 2)
        yield base
