"""Which GPU each embedded worker gets: ``CUDA_VISIBLE_DEVICES`` per worker process.

Design decisions:

- ``dynask run --workers N`` on a host with G GPUs (NVML's inventory) gives worker i GPU
  ``i % G`` (round robin), so 8 workers on 8 GPUs hold 8 distinct devices. Each worker
  process sees its GPU first, as ``cuda:0`` (the engine needs no device index), and the
  host's other GPUs after it, as dask-cuda does: CUDA IPC between engines on different
  GPUs (``--kv-transport cuda_ipc``) needs the peer's GPU visible.
- More workers than GPUs only when asked: ``--engines-per-gpu K`` (at most K engines per
  GPU), or an explicit ``--gpu-memory-utilization`` small enough for ``ceil(N / G)``
  engines per GPU. Without a fraction, K engines per GPU get 0.9 / K each. The fractions
  of the engines on one GPU must add up to at most 1 (each engine's fraction bounds its
  weights + activations + KV cache: ``actors.engine.kv_cache.sizing``); more is refused before
  any worker starts, naming the GPU and the sum.
- A worker added later (the admin UI's "Start a local worker") is pinned round robin
  past the plan (``placement_of``) and checked as ``dynask run`` checks its plan: one
  that would take its GPU past 1 is refused before it starts (``check_one_more``).
- Workers the operator starts (``dask worker``, ``dask cuda worker``) are used as they
  are: their environment is theirs. The commands we print pin one GPU per worker.
- No GPU (NVML finds none) or a CPU device: no pinning, nothing changes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from distributed import LocalCluster

from dynask.actors.runtime.gpu_discovery import GPUInfo

DEFAULT_UTILIZATION = 0.9  # the engine's own default, shared by the engines of one GPU


@dataclass(frozen=True)
class WorkerPlacement:
    """One embedded worker's GPU and the memory fraction its engine may use."""

    worker: int
    gpu: int  # NVML index on this host
    gpu_name: str
    fraction: float
    host_gpus: tuple[int, ...] = ()  # every GPU of the host, visible after the own one

    @property
    def env(self) -> dict[str, str]:
        others = [str(g) for g in self.host_gpus if g != self.gpu]
        return {"CUDA_VISIBLE_DEVICES": ",".join([str(self.gpu), *others])}


def place_workers(
    n_workers: int,
    gpus: Sequence[GPUInfo],
    engines_per_gpu: int | None = None,
    fraction: float | None = None,
) -> list[WorkerPlacement]:
    """Round-robin placement of ``n_workers`` engines on ``gpus`` (module docstring);
    ``ValueError`` when they do not fit. No GPUs: an empty list (nothing is pinned)."""
    if not gpus:
        return []
    if engines_per_gpu is not None and engines_per_gpu < 1:
        raise ValueError(f"--engines-per-gpu has value {engines_per_gpu}; use an integer >= 1")
    per_gpu = engines_per_gpu or (math.ceil(n_workers / len(gpus)) if fraction else 1)
    if n_workers > per_gpu * len(gpus):
        raise ValueError(
            f"{n_workers} engine workers need {n_workers} GPUs at {per_gpu} engine(s) per GPU; "
            f"this host has {len(gpus)}. Share GPUs with --engines-per-gpu "
            f"{math.ceil(n_workers / len(gpus))} (or a --gpu-memory-utilization whose "
            "engines add up to at most 1 per GPU), or start fewer workers"
        )
    share = fraction if fraction is not None else round(DEFAULT_UTILIZATION / per_gpu, 4)
    host = tuple(gpu.index for gpu in gpus)
    placements = [
        WorkerPlacement(i, gpus[i % len(gpus)].index, gpus[i % len(gpus)].name, share, host)
        for i in range(n_workers)
    ]
    check_fractions(placements)
    return placements


def check_fractions(placements: Sequence[WorkerPlacement]) -> None:
    """Refuses placements whose engines on one GPU ask for more than all of it."""
    by_gpu: dict[int, list[float]] = {}
    for placement in placements:
        by_gpu.setdefault(placement.gpu, []).append(placement.fraction)
    for gpu, fractions in sorted(by_gpu.items()):
        if sum(fractions) > 1 + 1e-9:
            shares = " + ".join(f"{f:g}" for f in fractions)
            raise ValueError(
                f"GPU {gpu} would hold {len(fractions)} engines at gpu_memory_utilization "
                f"{shares} = {sum(fractions):.2f} of its memory; the engines of one GPU must "
                f"add up to at most 1 (e.g. --gpu-memory-utilization "
                f"{math.floor(100 / len(fractions)) / 100:g})"
            )


def placement_of(placements: Sequence[WorkerPlacement], worker: int) -> WorkerPlacement:
    """Worker ``worker``'s GPU and fraction: the plan's, round robin past its end."""
    return dataclasses.replace(placements[worker % len(placements)], worker=worker)


def check_one_more(
    placements: Sequence[WorkerPlacement], running: Iterable[int | str], new: int | str
) -> None:
    """``ValueError`` (``check_fractions``' message) when worker ``new``, pinned round
    robin beside the ``running`` workers (names), would over-commit its GPU."""
    names = [*(int(name) for name in running), int(new)]
    check_fractions([placement_of(placements, name) for name in names])


class PinnedLocalCluster(LocalCluster):
    """A ``LocalCluster`` whose worker i starts with ``CUDA_VISIBLE_DEVICES`` of GPU i.

    Start it with ``n_workers=0`` and ``scale(n)``: every worker, the ones added later
    too, comes from ``new_worker_spec``, which adds the pin (round robin past the plan).
    """

    def __init__(self, placements: Sequence[WorkerPlacement], **kwargs: Any) -> None:
        self.placements = list(placements)
        super().__init__(n_workers=0, **kwargs)  # type: ignore[no-untyped-call]

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        specs: dict[Any, dict[str, Any]] = super().new_worker_spec()  # type: ignore[no-untyped-call]
        pinned = {}
        for name, spec in specs.items():
            placement = placement_of(self.placements, int(name))
            options = {
                **spec["options"],
                "env": {**spec["options"].get("env", {}), **placement.env},
            }
            pinned[name] = {**spec, "options": options}
        return pinned


def placements_for_run(
    n_workers: int,
    device: str,
    gpus: Sequence[GPUInfo],
    engines_per_gpu: int | None,
    fraction: float | None,
) -> list[WorkerPlacement]:
    """``dynask run``'s placement: none for a CPU or a named ``cuda:N`` device (the
    operator chose), else ``place_workers`` over the host's GPUs."""
    if device not in ("auto", "cuda"):
        if engines_per_gpu is not None:
            raise ValueError(f"--engines-per-gpu needs --device auto or cuda, not {device!r}")
        return []
    return place_workers(n_workers, gpus, engines_per_gpu, fraction)


async def embedded_cluster(n_workers: int, placements: Sequence[WorkerPlacement]) -> LocalCluster:
    """``dynask run``'s own cluster: worker processes (isolated as on a real cluster),
    each pinned to its GPU when ``placements`` name them."""
    cores = os.cpu_count() or 1
    options: dict[str, Any] = {
        "threads_per_worker": max(1, cores // max(1, n_workers)),
        "processes": True,
        "asynchronous": True,
        "dashboard_address": None,
    }
    if not placements:
        return await LocalCluster(n_workers=n_workers, **options)  # type: ignore[no-untyped-call]
    cluster = await PinnedLocalCluster(placements, **options)
    await cluster.scale(n_workers)  # type: ignore[no-untyped-call]
    return cluster
