"""The processes a serving benchmark talks to, started and always stopped again.

Two stacks, each a context manager that yields a ``ServingTarget``:

* ``dynask_stack``: ``dask scheduler``, one ``dask worker`` (one thread) and
  ``dynask serve`` with a one-deployment ``deploy.yaml``, each in its own process.
* ``dynamo_stack``: NVIDIA Dynamo's OpenAI frontend and its mocker, from the peer
  install in ``../shared/peers/dynamo`` (``dynamo.sh setup`` builds its venv).

Design decisions:

- Every child starts in a new session, so it leads its own process group; stopping
  sends SIGTERM to the whole group (a dask worker's nanny child included), then SIGKILL
  after a grace period. Children also get SIGTERM from the kernel if this process dies
  without cleaning up (``PR_SET_PDEATHSIG``), so a killed benchmark leaves nothing behind.
- CPU time is read from ``/proc/PID/stat`` (utime + stime of all threads of a process);
  a process group's time sums its live members.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0
DYNAMO_MODEL = "smollm2"
DYNAMO_NO_SIM_SPEEDUP = 1_000_000  # 0 behaves like 1 in Dynamo 1.6.1 (see its peer README)


@dataclass(frozen=True)
class ServingTarget:
    """An OpenAI-compatible endpoint and the processes whose CPU time we charge to it."""

    system: str  # "dynask" or "dynamo"
    base_url: str  # http://127.0.0.1:PORT
    model: str  # what clients send as "model"
    frontend_pid: int  # the control plane: dynask serve, or Dynamo's frontend
    engine_pgid: int  # the engine's process group: the dask worker, or Dynamo's mocker


@dataclass
class ManagedProcess:
    """A child process leading its own process group, with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after the grace period; reaps the child."""
        if self._stopped:
            return
        self._stopped = True
        _signal_group(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=STOP_GRACE_S)
        _signal_group(self.pid, signal.SIGKILL)  # stragglers the leader left behind


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the benchmark process dies.

    Linux sends the signal when the *thread* that started the child ends, not the whole
    process: start children from the main thread (never from ``asyncio.to_thread``,
    whose pool threads end with their event loop)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextmanager
def spawned(
    name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[ManagedProcess]:
    """Starts ``argv`` in its own session; stops its whole group on exit."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=env,
        )
    process = ManagedProcess(name, popen, log_path)
    try:
        yield process
    finally:
        process.stop()


# ---- CPU time ---------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (which may contain spaces)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all of its threads."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _pids_where(field: int, value: int) -> list[int]:
    """The live processes whose stat field number ``field`` (after the name) is ``value``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # exited while we looked
        if int(fields[field]) == value:
            found.append(int(entry.name))
    return sorted(found)


def group_pids(pgid: int) -> list[int]:
    """The live processes of a process group."""
    return _pids_where(2, pgid)


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return _pids_where(1, pid)


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds of the live processes of a process group."""
    total = 0.0
    for pid in group_pids(pgid):
        try:
            total += cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # exited while we looked
    return total


# ---- ports ----------------------------------------------------------------------------------


LOWEST_PORT = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held together while drawn, so none twice),
    below the kernel's ephemeral range.

    A port from ``bind(0)`` is an ephemeral one, the range the machine's outgoing
    connections draw from too: between the probe and the server's own bind, a connection
    (a server's own Dask workers dialling their scheduler) can take it — a clean-clone
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


# ---- waiting for readiness ----------------------------------------------------------------


def wait_until_ready(
    url: str, expect: str, timeout_s: float, watched: list[ManagedProcess]
) -> None:
    """Polls ``url`` until it answers 200 with ``expect`` in the body; fails fast on a death."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        for process in watched:
            if not process.alive():
                raise RuntimeError(
                    f"{process.name} exited with status {process.popen.returncode} before "
                    f"{url} was ready; its log ends with:\n{process.log_tail()}"
                )
        try:
            response = httpx.get(url, timeout=2.0)
            if response.status_code == 200 and expect in response.text:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    logs = "".join(f"\n--- {p.name} log ends with:\n{p.log_tail()}" for p in watched)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s; last answer: {last}{logs}")


# ---- dynask ---------------------------------------------------------------------------------


def write_deploy_file(path: Path, engine: str, engine_args: dict[str, Any]) -> str:
    """A one-deployment deploy.yaml; returns the model name clients send."""
    model_name = f"bench-{engine}"
    deployment = {
        "name": model_name,
        "model_name": model_name,
        "engine": engine,
        "replicas": 1,
        "engine_args": engine_args,
    }
    path.write_text(yaml.safe_dump({"deployments": [deployment]}, sort_keys=False))
    return model_name


@contextmanager
def dynask_stack(
    venv_bin: Path,
    engine: str,
    engine_args: dict[str, Any],
    workdir: Path,
    ready_timeout_s: float,
    serve_args: Sequence[str] = (),
) -> Iterator[ServingTarget]:
    """Scheduler, one worker and ``dynask serve`` (with ``serve_args``), each its own
    process."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = write_deploy_file(workdir / "deploy.yaml", engine, engine_args)
    scheduler = f"tcp://127.0.0.1:{free_port()}"
    http_port = free_port()
    with ExitStack() as stack:
        started = [
            stack.enter_context(spawned(name, argv, workdir))
            for name, argv in (
                ("scheduler", _scheduler_argv(venv_bin, scheduler)),
                ("worker", _worker_argv(venv_bin, scheduler)),
                ("serve", [*_serve_argv(venv_bin, scheduler, workdir, http_port), *serve_args]),
            )
        ]
        base_url = f"http://127.0.0.1:{http_port}"
        wait_until_ready(f"{base_url}/health", '"ready"', ready_timeout_s, started)
        yield ServingTarget("dynask", base_url, model, started[2].pid, started[1].pid)


def _scheduler_argv(venv_bin: Path, address: str) -> list[str]:
    port = address.rsplit(":", 1)[1]
    return [
        str(venv_bin / "dask"),
        "scheduler",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--no-dashboard",
    ]


def _worker_argv(venv_bin: Path, address: str) -> list[str]:
    return [
        str(venv_bin / "dask"),
        "worker",
        address,
        "--nthreads",
        "1",
        "--no-dashboard",
        "--memory-limit",
        "0",
        "--name",
        "w1",
    ]


def _serve_argv(venv_bin: Path, scheduler: str, workdir: Path, port: int) -> list[str]:
    return [
        str(venv_bin / "dynask"),
        "serve",
        "--scheduler",
        scheduler,
        "-f",
        str(workdir / "deploy.yaml"),
        "--port",
        str(port),
        "--database-url",
        f"sqlite:///{workdir / 'state.db'}",
        "--no-require-api-key",  # the load clients send no key (Dynamo's frontend needs none)
    ]


# ---- NVIDIA Dynamo --------------------------------------------------------------------------


@dataclass(frozen=True)
class DynamoInstall:
    """The peer install: its scripts beside ``dynamo.sh``, its venv under ``home``."""

    scripts: Path  # ../shared/peers/dynamo
    home: Path  # $PEER_DYNAMO_DIR or ~/.peer_dynamo

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    def is_set_up(self) -> bool:
        return self.python.exists() and (self.home / "smollm2-tok" / "tokenizer.json").exists()

    def set_up(self, log_path: Path, timeout_s: float) -> None:
        """Runs ``dynamo.sh setup`` (pip installs into its own venv); raises on failure."""
        with log_path.open("wb") as log:
            done = subprocess.run(
                [str(self.scripts / "dynamo.sh"), "setup"],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
        if done.returncode != 0 or not self.is_set_up():
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"dynamo.sh setup failed (status {done.returncode}):\n{tail}")


@contextmanager
def dynamo_stack(
    install: DynamoInstall, workdir: Path, ready_timeout_s: float
) -> Iterator[ServingTarget]:
    """Dynamo's frontend and mocker (simulated time removed), as start_dynamo.sh starts them."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    kv_dir = workdir / "kvstore"  # a private discovery folder: no clash with other instances
    kv_dir.mkdir(exist_ok=True)
    frontend = f"-m dynamo.frontend --http-host 127.0.0.1 --http-port {port}"
    mocker = (
        f"-m dynamo.mocker --model-path {install.home / 'smollm2-tok'} "
        f"--model-name {DYNAMO_MODEL} --speedup-ratio {DYNAMO_NO_SIM_SPEEDUP}"
    )
    with ExitStack() as stack:
        started = [
            stack.enter_context(spawned(name, _dynamo_argv(install, kv_dir, args), workdir))
            for name, args in (("dynamo-frontend", frontend), ("dynamo-mocker", mocker))
        ]
        base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(f"{base_url}/v1/models", DYNAMO_MODEL, ready_timeout_s, started)
        yield ServingTarget("dynamo", base_url, DYNAMO_MODEL, started[0].pid, started[1].pid)


def _dynamo_argv(install: DynamoInstall, kv_dir: Path, module_args: str) -> list[str]:
    """bash sources the peer's env.sh, then execs Python, so the pid stays the process's."""
    script = (
        f'. "{install.scripts / "env.sh"}" && export DYN_FILE_KV="{kv_dir}" && '
        f'exec "{install.python}" {module_args}'
    )
    return ["bash", "-c", script]
