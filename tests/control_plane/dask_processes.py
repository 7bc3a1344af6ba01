"""A real Dask cluster of processes for failure tests: one scheduler, workers by name.

Workers run without a nanny on a known port, so a test knows which process holds which
worker address and can ``kill -9`` or ``SIGSTOP`` exactly that one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.control_plane import server_process as sp


@dataclass
class DaskProcesses:
    folder: Path
    address: str = ""
    scheduler: subprocess.Popen[bytes] | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by address

    def start_scheduler(self) -> str:
        port = sp.free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        argv = ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
        self.scheduler = sp.start([str(sp.BIN / "dask"), *argv], self.folder / "scheduler.log")
        return self.address

    def start_worker(
        self, name: str, extra_env: dict[str, str] | None = None, port: int | None = None
    ) -> str:
        """Starts a worker process (one thread, no nanny) with ``extra_env`` added to its
        environment, on ``port`` (default: a free one); returns its address."""
        port = sp.free_port() if port is None else port
        argv = [
            *("worker", self.address, "--name", name, "--nthreads", "1", "--no-dashboard"),
            *("--memory-limit", "0", "--no-nanny", "--host", "127.0.0.1"),
            *("--worker-port", str(port)),
        ]
        proc = sp.start([str(sp.BIN / "dask"), *argv], self.folder / f"{name}.log", extra_env)
        address = f"tcp://127.0.0.1:{port}"
        self.workers[address] = proc
        return address

    def kill(self, address: str) -> None:
        """``kill -9`` of the worker process at ``address``."""
        proc = self.workers.pop(address)
        proc.kill()
        proc.wait(timeout=30)

    def pause(self, address: str) -> None:
        os.kill(self.workers[address].pid, signal.SIGSTOP)

    def resume(self, address: str) -> None:
        os.kill(self.workers[address].pid, signal.SIGCONT)

    def stop_all(self) -> None:
        for proc in self.workers.values():
            os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGINT
            sp.stop(proc)
        self.workers.clear()
        if self.scheduler is not None:
            sp.stop(self.scheduler)


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[DaskProcesses]:
    """A real ``dask scheduler`` process (start workers with ``start_worker``)."""
    processes = DaskProcesses(tmp_path)
    processes.start_scheduler()
    try:
        yield processes
    finally:
        processes.stop_all()
