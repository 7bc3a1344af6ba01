"""Starting real ``dynask`` / ``dask`` processes for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.common.processes import EPHEMERAL_RANGE, LOWEST_PORT, free_port, free_ports

__all__ = ["EPHEMERAL_RANGE", "LOWEST_PORT", "free_port", "free_ports"]

BIN = Path(sys.executable).parent


def start(
    args: list[str], log: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    handle = log.open("wb")
    return subprocess.Popen(
        args, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def wait_healthy(
    base_url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 240
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"server not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


@contextmanager
def dynask_run(
    folder: Path, args: list[str], env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``dynask run ARGS`` on a free port with its SQLite database and log in ``folder``;
    yields (base URL, process) once ``/health`` answers, and stops it afterwards."""
    port = free_port()
    log = folder / "dynask-run.log"
    argv = [str(BIN / "dynask"), "run", *args, "--port", str(port)]
    argv += ["--database-url", f"sqlite:///{folder / 'state.db'}"]
    proc = start(argv, log, env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log)
        yield base, proc
    finally:
        stop(proc)


def wait_for_log(
    log: Path, text: bytes, proc: subprocess.Popen[bytes], timeout: float = 180
) -> None:
    """Waits until ``text`` appears in ``log``; fails at once if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_bytes():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    raise TimeoutError(f"no {text!r} after {timeout}s:\n{log.read_text()}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_for_engines(
    base_url: str, count: int, timeout: float = 120, api_key: str | None = None
) -> list[dict[str, object]]:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engines = httpx.get(f"{base_url}/v1/engines", headers=headers, timeout=10).json()
        if len(engines) >= count:
            return list(engines)
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {count} engines after {timeout}s")


def maps_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's native library mapped (it imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def server_processes(base_url: str) -> list[int]:
    """The ``dynask`` process this test session started serving ``base_url``, then every
    process below it (its workers and Dask's helpers)."""
    import psutil

    port = base_url.rsplit(":", 1)[1]
    for child in psutil.Process().children(recursive=True):
        argv = child.cmdline()
        if "--port" in argv and argv[argv.index("--port") + 1] == port:
            return [child.pid, *(p.pid for p in child.children(recursive=True))]
    raise LookupError(f"no process of this session serves {base_url}")
