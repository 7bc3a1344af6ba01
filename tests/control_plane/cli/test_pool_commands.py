"""The seeds' multi-node commands on a real ``dask scheduler`` with real processes:
``dynask run in=dyn://POOL out=ENGINE`` nodes join, ``in=http out=dyn://POOL`` serves
them to the ``openai`` client, ``in=text out=dyn://POOL`` chats with them."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import openai
import pytest

from dynask.control_plane.cli.main import main
from tests.control_plane import server_process as sp
from tests.control_plane.dask_processes import DaskProcesses

DYNASK = str(sp.BIN / "dynask")
JOINED = b"this node joined pool 'chat'"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "in=dyn://chat", "out=echo"], "in=dyn://chat joins a cluster: add --scheduler"),
        (["run", "in=dyn://Chat", "out=echo", "--scheduler", "tcp://h:1"], "'name' has value"),
        (["run", "in=dyn://", "--scheduler", "tcp://h:1"], "'dyn://' is not a pool address"),
        (["run", "out=dyn://chat"], "out=dyn://chat serves a cluster's pool: add --scheduler"),
        (
            ["run", "m.gguf", "out=dyn://chat", "--scheduler", "tcp://h:1"],
            "out=dyn://chat serves the pool's model: give MODEL to its nodes",
        ),
        (
            ["run", "in=batch:x.jsonl", "out=dyn://chat", "--scheduler", "tcp://h:1"],
            "out=dyn://chat works with in=http or in=text, not in=batch:x.jsonl",
        ),
        (["run", "out=echo", "--scheduler", "tcp://h:1"], "dynask run --scheduler is for pools"),
    ],
)
def test_wrong_pool_commands_say_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _node(
    folder: Path, scheduler: str, name: str, engine: str = "echo", sigint_ignored: bool = False
) -> subprocess.Popen[bytes]:
    argv = [DYNASK, "run", "in=dyn://chat", f"out={engine}", "--model-name", "chat"]
    argv += ["--scheduler", scheduler]
    if sigint_ignored:  # as a script's ``dynask run ... &`` starts it
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    return sp.start(argv, folder / f"{name}.log")


def _engines_become(base: str, count: int, timeout: float = 120) -> list[dict[str, object]]:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engines = list(httpx.get(f"{base}/v1/engines", timeout=10).json())
        if len(engines) == count:
            return engines
        time.sleep(0.5)
    raise TimeoutError(f"not {count} engines after {timeout}s: {engines}")


@pytest.mark.slow
def test_nodes_join_a_pool_and_a_front_end_serves_it(
    dask_cluster: DaskProcesses, tmp_path: Path
) -> None:
    first = _node(tmp_path, dask_cluster.address, "node-1", sigint_ignored=True)
    nodes = [first]
    try:
        sp.wait_for_log(tmp_path / "node-1.log", JOINED, first)
        front = ["in=http", "out=dyn://chat", "--scheduler", dask_cluster.address]
        with sp.dynask_run(tmp_path, front) as (base, _):
            [engine] = _engines_become(base, 1)
            assert engine["deployment"] == "chat"
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
            reply = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hello pool"}]
            )
            assert "hello pool" in (reply.choices[0].message.content or "")
            assert [m.id for m in client.models.list()] == ["chat"]

            # Two more nodes at once (each a process start): one joins, one is refused.
            second = _node(tmp_path, dask_cluster.address, "node-2")
            nodes.append(second)
            wrong = _node(tmp_path, dask_cluster.address, "node-3", engine="mocker")
            nodes.append(wrong)
            sp.wait_for_log(tmp_path / "node-2.log", JOINED, second)
            assert len(_engines_become(base, 2)) == 2  # the new node got an engine

            assert wrong.wait(timeout=120) == 2
            assert "pool 'chat' serves bundled:SmolLM2-135M-Instruct with engine echo" in (
                (tmp_path / "node-3.log").read_text()
            )

            sp.stop(first, timeout=90)  # Ctrl-C: its worker leaves (a loaded host is slow)
            assert first.returncode == 130
            assert len(_engines_become(base, 1)) == 1
            again = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "still here"}]
            )
            assert "still here" in (again.choices[0].message.content or "")
        chat = subprocess.run(
            [DYNASK, "run", "in=text", "out=dyn://chat", "--scheduler", dask_cluster.address],
            input="talk to the pool\nexit\n",
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert chat.returncode == 0, chat.stderr
        assert "model> " in chat.stdout and "talk to the pool" in chat.stdout.split("model> ")[1]
    finally:
        for node in nodes:
            sp.stop(node)
