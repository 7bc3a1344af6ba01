"""The soak benchmark's cluster: a scheduler, workers that can be killed, ``dynask serve``.

Workers run without a nanny on known ports, so the soak knows which process holds
which worker address (``/v1/engines`` names it) and can ``kill -9`` exactly that one
and start a replacement. Every process leads its own group and is stopped on exit
(``serve_cluster.spawned``).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common.processes import ManagedProcess, free_port, spawned, wait_until_ready

MODEL = "soak-echo"


@dataclass
class SoakCluster:
    venv_bin: Path
    workdir: Path
    stack: ExitStack
    scheduler: str = ""
    base_url: str = ""
    serve: ManagedProcess | None = None
    workers: dict[str, ManagedProcess] = field(default_factory=dict)  # by address
    _started: int = 0

    def start(self, replicas: int, echo_delay_s: float, serve_flags: list[str]) -> None:
        self.scheduler = f"tcp://127.0.0.1:{free_port()}"
        port = self.scheduler.rsplit(":", 1)[1]
        argv = [str(self.venv_bin / "dask"), "scheduler", "--host", "127.0.0.1"]
        self._spawn("scheduler", [*argv, "--port", port, "--no-dashboard"])
        for _ in range(replicas):
            self.start_worker()
        deployment = {
            "name": MODEL,
            "model_name": MODEL,
            "engine": "echo",
            "replicas": replicas,
            "engine_args": {"delay_s": echo_delay_s},
        }
        deploy = self.workdir / "deploy.yaml"
        deploy.write_text(yaml.safe_dump({"deployments": [deployment]}, sort_keys=False))
        http_port = free_port()
        self.serve = self._spawn(
            "serve",
            [
                *(str(self.venv_bin / "dynask"), "serve", "--scheduler", self.scheduler),
                *("-f", str(deploy), "--port", str(http_port), "--no-require-api-key"),
                *("--database-url", f"sqlite:///{self.workdir / 'state.db'}"),
                *serve_flags,
            ],
        )
        self.base_url = f"http://127.0.0.1:{http_port}"
        wait_until_ready(f"{self.base_url}/health", '"ready"', 300, [self.serve])
        self.wait_engines(replicas, 300)

    def start_worker(self) -> str:
        self._started += 1
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        self.workers[address] = self._spawn(
            f"worker-{self._started}",
            [
                *(str(self.venv_bin / "dask"), "worker", self.scheduler, "--nthreads", "1"),
                *("--no-dashboard", "--memory-limit", "0", "--no-nanny"),
                *("--host", "127.0.0.1", "--worker-port", str(port)),
            ],
        )
        return address

    def kill_worker(self, address: str) -> None:
        """``kill -9`` of one worker process."""
        process = self.workers.pop(address)
        process.popen.kill()
        process.popen.wait(timeout=30)

    def engines(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = httpx.get(f"{self.base_url}/v1/engines", timeout=60).json()
        return data

    def wait_engines(self, count: int, timeout_s: float) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.engines()) >= count:
                return
            time.sleep(0.5)
        raise TimeoutError(f"fewer than {count} engines after {timeout_s:.0f} s")

    def serve_rss_mib(self) -> float:
        """Resident memory of the control plane (``VmRSS``)."""
        assert self.serve is not None
        for line in Path(f"/proc/{self.serve.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS in /proc/PID/status")

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.base_url}/metrics", timeout=60).text
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        return self.stack.enter_context(spawned(name, argv, self.workdir))
