"""Starting real ``dynask`` / ``dask`` processes for end-to-end tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


LOWEST_PORT = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held together while drawn, so none twice),
    below the kernel's ephemeral range.

    A port from ``bind(0)`` is an ephemeral one, the range the machine's outgoing
    connections draw from too: between the probe and the server's own bind, a connection
    (``dynask run``'s Dask workers dialling their scheduler) can take it — a clean-clone
    run on 2026-12-04 lost a module's tests to "address already in use". Below the range,
    only explicit binds take ports.
    """
    lowest_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    rng = random.Random()
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", rng.randrange(LOWEST_PORT, lowest_ephemeral)))
            except OSError:  # in use: draw again
                sock.close()
                continue
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


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
