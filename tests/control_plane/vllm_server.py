"""A real ``vllm serve`` (vLLM's CPU build, OpenAI API server) of a model, for tests of
``out=openai:URL``: started in its own process group, killed with it afterwards.

CPU settings as in the ``out=vllm`` tests: float32 (bfloat16 gave garbage on these CPUs),
eager mode (compiling takes minutes on two cores), a 1 GiB KV cache, no core pinning.
Its model runner lives in the engine-core process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
selects vLLM's one-process executor): two processes per server instead of three, so one
import of vLLM fewer (about a quarter of a start on two cores). What dynask meets, the
API server and its engine core's KV events, is the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.control_plane.server_process import free_ports, start, wait_healthy

BLOCK_SIZE = 32
START_TIMEOUT_S = 600.0


@dataclass
class VLLMServer:
    url: str  # http://127.0.0.1:PORT (no /v1)
    kv_events_endpoint: str  # tcp://127.0.0.1:PORT of its KV event publisher
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL to the server and its engine-core process (a crash, not a shutdown)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def metric(self, name: str) -> float:
        """One unlabelled-by-us gauge or counter of its ``/metrics`` (summed over labels)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(f"{name}{{") or line.startswith(f"{name} ")
        ]
        return sum(values)


def launch(model_folder: Path, log: Path, port: int, kv_port: int) -> VLLMServer:
    """Starts a server on ``port`` (not yet ready: ``wait_ready``)."""
    kv_config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{kv_port}",
    }
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--block-size",
        str(BLOCK_SIZE),
        "--max-num-seqs",
        "8",
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        json.dumps(kv_config),
    ]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    proc = start(argv, log, env)
    return VLLMServer(f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{kv_port}", proc, log)


def wait_ready(server: VLLMServer) -> None:
    try:
        wait_healthy(server.url, server.proc, server.log, timeout=START_TIMEOUT_S)
    except BaseException:
        server.kill()
        raise


@contextmanager
def vllm_servers(model_folder: Path, folder: Path, count: int) -> Iterator[list[VLLMServer]]:
    """``count`` servers of the model, started at once; all killed afterwards."""
    ports = free_ports(2 * count)
    servers = [
        launch(model_folder, folder / f"vllm-{i}.log", ports[2 * i], ports[2 * i + 1])
        for i in range(count)
    ]
    try:
        for server in servers:
            wait_ready(server)
        yield servers
    finally:
        for server in servers:
            server.kill()
