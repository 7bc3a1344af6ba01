"""A FAKE NVML (no GPU exists here): a ``pynvml`` module that lists N made-up GPUs.

``install_fake_nvml(folder, count)`` writes it as ``folder/pynvml.py``; put ``folder``
first on ``PYTHONPATH`` (and ``sys.path``) and every process that imports ``pynvml``
sees ``count`` GPUs named "FAKE GPU", 80 GiB each, ``i`` GiB used on GPU ``i``.
"""

from __future__ import annotations

from pathlib import Path

_SOURCE = '''"""FAKE pynvml for tests: COUNT made-up GPUs (there is no GPU on this machine)."""
from types import SimpleNamespace

COUNT = {count}
GIB = 2**30


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return COUNT


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return b"FAKE GPU"


def nvmlDeviceGetUUID(handle):
    return f"GPU-fake-{{handle:04d}}"


def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(total=80 * GIB, used=handle * GIB, free=(80 - handle) * GIB)


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=10 * handle)
'''


def install_fake_nvml(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pynvml.py").write_text(_SOURCE.format(count=count))
    return folder
