"""The remote worker's request checks and shell commands, exactly."""

from __future__ import annotations

import subprocess

import pytest

from dynask.control_plane.cluster.remote_commands import (
    RemoteWorkerRequest,
    environment_check,
    is_loopback,
    worker_command,
    worker_name,
)


def test_one_worker_per_gpu_or_one_cpu_worker() -> None:
    assert RemoteWorkerRequest("h", "u", "/venv", gpus=3).gpu_indices == [0, 1, 2]
    assert RemoteWorkerRequest("h", "u", "/venv").gpu_indices == [None]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"host": "bad host"}, "'host' has value 'bad host'; expected a host name"),
        ({"user": "r;m"}, "'user' has value 'r;m'; expected a user name"),
        ({"port": 0}, "'port' has value 0; expected an integer from 1 to 65535"),
        ({"gpus": -1}, "'gpus' has value -1; expected an integer from 0 to 16"),
        ({"gpus": True}, "'gpus' has value True; expected an integer from 0 to 16"),
        ({"environment": "venv"}, "'environment' has value 'venv'; expected an absolute path"),
    ],
)
def test_a_bad_field_is_named(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"host": "gpu-1", "user": "ops", "environment": "/opt/venv"}
    with pytest.raises(ValueError, match=message):
        RemoteWorkerRequest(**{**fields, **changes})  # type: ignore[arg-type]


def test_loopback_hosts() -> None:
    assert [is_loopback(h) for h in ("localhost", "127.0.0.1", "::1", "[::1]")] == [True] * 4
    assert [is_loopback(h) for h in ("10.0.0.2", "gpu-1", "example.com")] == [False] * 3


def test_worker_names() -> None:
    assert worker_name(3, "gpu-node.lan", 1) == "remote-3-gpu-node-lan-gpu1"
    assert worker_name(1, "10.0.0.2", None) == "remote-1-10-0-0-2-cpu"


def test_a_gpu_worker_is_pinned_and_offers_its_gpu() -> None:
    command = worker_command("/opt/venv", "tcp://10.0.0.1:8786", "remote-1-h-gpu2", 2)
    assert command == (
        'cd / && PY="$(if [ -d /opt/venv ]; then echo /opt/venv/bin/python; else echo '
        '/opt/venv; fi)" && exec env CUDA_VISIBLE_DEVICES=2 "$PY" -m '
        "distributed.cli.dask_worker tcp://10.0.0.1:8786 --name remote-1-h-gpu2 --nthreads 1 "
        "--no-dashboard --death-timeout 60 --resources GPU=1"
    )


def test_values_are_quoted_for_the_shell() -> None:
    command = worker_command("/opt/my env", "tcp://h:1", "n", None)
    assert "'/opt/my env'/bin/python" in command
    assert "CUDA_VISIBLE_DEVICES" not in command and "GPU=1" not in command


def test_the_environment_check_runs_in_a_shell(tmp_path: object) -> None:
    done = subprocess.run(
        ["sh", "-c", environment_check("/nonexistent/venv")], capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (
        127,
        "/nonexistent/venv is not an executable python\n",
    )
