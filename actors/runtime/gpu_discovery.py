"""GPU discovery on Dask workers with NVIDIA's NVML (``nvidia-ml-py``, imported as pynvml).

On a machine without NVIDIA's library, ``nvmlInit`` raises ``NVMLError_LibraryNotFound``:
that means "no GPU" and is reported as an empty list, never a crash.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

log = logging.getLogger(__name__)

PLUGIN_NAME = "dynask-gpu-discovery"


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    memory_total: int  # bytes
    memory_used: int
    utilization: int  # percent


def discover_gpus() -> list[GPUInfo]:
    """The GPUs NVML sees on this host; empty when there is no NVIDIA driver or GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no GPU: NVML is unavailable (%s)", exc)
        return []
    try:
        return [_read_gpu(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _read_gpu(pynvml: Any, index: int) -> GPUInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    return GPUInfo(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        memory_total=int(memory.total),
        memory_used=int(memory.used),
        utilization=int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
    )


class GPUDiscoveryPlugin(WorkerPlugin):
    """Records the worker's GPUs at start-up; ``worker_gpus`` reads them back."""

    name = PLUGIN_NAME

    def setup(self, worker: Any) -> None:
        worker.extensions[PLUGIN_NAME] = [asdict(gpu) for gpu in discover_gpus()]


def worker_gpus(dask_worker: Any) -> list[dict[str, Any]]:
    """For ``client.run``: fresh GPU readings of this worker (memory and utilisation)."""
    gpus = [asdict(gpu) for gpu in discover_gpus()]
    dask_worker.extensions[PLUGIN_NAME] = gpus
    return gpus
