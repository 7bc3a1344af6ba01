"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

A decode step at small batch is ~250 short kernels (5–30 µs each at batch 1 on an
H200), and between two of them the GPU drains: the last programs of one finish while
the next is not yet launched, so HBM idles for a few microseconds per kernel. On
compute capability 9.0 and later a kernel launched with PDL (``launch_pdl``) may start
while the kernel before it in the stream is still running:

* every kernel that takes part calls ``gdc_launch_dependents`` as it starts (the next
  kernel may then launch once all of this one's programs are resident), and
* one launched with PDL calls ``gdc_wait`` before it reads anything an earlier kernel
  writes and before it writes anything (the wait returns once the kernel before it has
  completed and its writes are visible; each such kernel waits, so the order of the
  whole stream holds). The skinny GEMVs load their first block of weights before
  waiting: weights are never written, so that read overlaps the previous kernel's tail.

Kernels that do not take part (cuBLAS) keep the stream's usual order: a PDL kernel
after one of them launches when it ends. CUDA-graph capture keeps PDL launches as
programmatic edges. ``DYNASK_PDL=0`` turns it off (for same-run comparisons); Triton's
interpreter and GPUs before Hopper never use it.
"""

from __future__ import annotations

import os
from functools import cache

import torch


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` are launched with PDL."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("DYNASK_PDL", "1") == "0":
        return False
    return _hopper_or_later(device.index if device.index is not None else 0)


@cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def options(device: torch.device) -> dict[str, bool]:
    """The kernel's ``PDL`` constexpr and Triton's ``launch_pdl``: pass as ``**options``."""
    if enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
