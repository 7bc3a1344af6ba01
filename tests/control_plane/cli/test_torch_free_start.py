"""The control plane never imports torch or transformers' model code: every ``dynask``
process (and every Dask worker, which re-imports the CLI's module) would pay seconds for
it, tens of seconds on a loaded host. Only a process that builds a torch engine (or the
mocker, which is one) or converts a GGUF file loads torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.control_plane import server_process as sp

# What every dynask process and every worker imports: the CLI, the server, the admin UI,
# the engine actor (unpickled by workers) and the tokenizer the control plane rebuilds.
_IMPORTS = """
import sys
import dynask.actors.runtime.engine_actor
import dynask.control_plane.cli.main
import dynask.control_plane.server
import dynask.web.mount
from dynask.control_plane.cli.main import parse
parse(["run", "out=echo"])  # the flags' choices (KV transports) are read here
print(sorted(name for name in ("torch", "transformers") if name in sys.modules))
"""


def test_the_cli_server_and_engine_actor_modules_import_neither_torch_nor_transformers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_control_plane_loads_a_tokenizer_without_torch(tiny_llama_folder: Path) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dynask.control_plane.serving.service import tokenizer_from_files\n"
        f"folder = Path({str(tiny_llama_folder)!r})\n"
        "files = {p.name: p.read_bytes() for p in folder.iterdir() if 'tokenizer' in p.name}\n"
        "tokenizer = tokenizer_from_files(files)\n"
        "print(tokenizer('hello world')['input_ids'], 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[28120,", "905]", "False"]


def test_a_dynask_run_out_echo_loads_torch_in_no_process(
    tiny_llama_folder: Path, tmp_path: Path
) -> None:
    # A server of its own, not the session's echo_server: a structured-output request
    # (xgrammar imports torch) sent to that one by an earlier test would load torch there.
    args = [str(tiny_llama_folder), "out=echo", "--model-name", "tiny", "--workers", "1"]
    with sp.dynask_run(tmp_path, args) as (base, _):
        sp.wait_for_engines(base, 1)
        answer = httpx.post(
            f"{base}/v1/completions",
            json={"model": "tiny", "prompt": "hello world", "max_tokens": 2},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert sp.maps_torch(os.getpid())  # the check sees torch where it is (this process)
        processes = sp.server_processes(base)
        assert len(processes) >= 2  # the server and its worker (and Dask's helpers)
        assert [pid for pid in processes if sp.maps_torch(pid)] == []


def test_a_mocker_deployment_is_validated_without_torch() -> None:
    script = (
        "import sys\n"
        "from dynask.actors.runtime.engine_factory import EngineSpec\n"
        "EngineSpec('mocker', engine_args={'block_size': 64, 'speedup_ratio': 0})\n"
        "try:\n"
        "    EngineSpec('mocker', engine_args={'block_size': 0})\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "MockerConfig 'block_size' has value 0; expected an integer >= 1",
        "False",
    ]
