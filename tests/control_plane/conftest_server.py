"""A session-wide ``dynask run`` server over the tiny Llama model, two worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control_plane import server_process as sp


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = sp.free_port()
    folder = tmp_path_factory.mktemp("server")
    log = folder / "dynask-run.log"
    proc = sp.start(
        [
            str(sp.BIN / "dynask"),
            "run",
            str(tiny_llama_folder),
            "--model-name",
            "tiny",
            "--workers",
            "2",
            "--port",
            str(port),
            "--kv-cache-gib",
            "0.05",
            "--database-url",
            f"sqlite:///{folder / 'state.db'}",
        ],
        log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        sp.wait_healthy(base, proc, log)
        sp.wait_for_engines(base, 2)
        yield base
    finally:
        sp.stop(proc)
