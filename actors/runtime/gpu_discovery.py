"""GPU discovery on Dask workers with NVIDIA's NVML (``nvidia-ml-py``, imported as pynvml).

On a machine without NVIDIA's library, ``nvmlInit`` raises ``NVMLError_LibraryNotFound``:
that means "no GPU" and is reported as an empty list, never a crash.

NVML sees every GPU of the host whatever ``CUDA_VISIBLE_DEVICES`` says; a worker reports
the GPU its engine holds: the first one ``CUDA_VISIBLE_DEVICES`` names (``cuda:0`` in the
process; the others stay visible for CUDA IPC), so the Workers page shows it per engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
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
    uuid: str = ""  # NVML's "GPU-..." identifier


def process_gpus() -> list[GPUInfo]:
    """The GPU this process's engine holds when ``CUDA_VISIBLE_DEVICES`` pins one (its
    first entry, ``cuda:0``); else every GPU of the host."""
    gpus = visible_gpus(os.environ, discover_gpus())
    return gpus[:1] if "CUDA_VISIBLE_DEVICES" in os.environ else gpus


def visible_gpus(env: Mapping[str, str], gpus: Sequence[GPUInfo]) -> list[GPUInfo]:
    """The GPUs that ``CUDA_VISIBLE_DEVICES`` (indices or UUID prefixes) names, in its
    order; all of them when it is unset."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(gpus)
    chosen: list[GPUInfo] = []
    for item in (part.strip() for part in visible.split(",")):
        match = [g for g in gpus if item and (str(g.index) == item or g.uuid.startswith(item))]
        if not match:
            break  # CUDA ignores everything from the first entry it cannot resolve
        chosen.append(match[0])
    return chosen


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
        name=_text(name),
        memory_total=int(memory.total),
        memory_used=int(memory.used),
        utilization=int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GPUDiscoveryPlugin(WorkerPlugin):
    """Records the worker's GPUs at start-up; ``worker_gpus`` reads them back."""

    name = PLUGIN_NAME

    def setup(self, worker: Any) -> None:
        worker.extensions[PLUGIN_NAME] = [asdict(gpu) for gpu in process_gpus()]


def worker_gpus(dask_worker: Any) -> list[dict[str, Any]]:
    """For ``client.run``: fresh readings (memory and utilisation) of this worker's GPUs."""
    gpus = [asdict(gpu) for gpu in process_gpus()]
    dask_worker.extensions[PLUGIN_NAME] = gpus
    return gpus
