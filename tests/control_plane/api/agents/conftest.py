"""One ``dynask run`` for the agent-client tests: the scripted tool-calling engine
(``out=python:scripted_agent.py``, see its docstring) over the tiny Llama folder's
tokenizer (SmolLM2's template: no tool support, so dynask's default Hermes format),
with ``--reasoning-parser deepseek_r1``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control_plane import server_process as sp

SCRIPT = Path(__file__).with_name("scripted_agent.py")
MODEL = "agent"


@pytest.fixture(scope="session")
def agent_server(
    tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("agent-server")
    args = [
        f"out=python:{SCRIPT}",
        str(tiny_llama_folder),
        "--model-name",
        MODEL,
        "--reasoning-parser",
        "deepseek_r1",
    ]
    with sp.dynask_run(folder, args) as (base, _):
        sp.wait_for_engines(base, 1)
        yield base
