"""Choosing a kernel at start-up by timing it on the GPU at hand: the unfused torch ops
against each candidate tile of a fused Triton kernel (``skinny_matmul``, ``gated_gemm``).

* A candidate that fails to run (resources this GPU lacks) or whose output is not the
  unfused ops' (``same_output``: a kernel not yet verified on this GPU reading or writing
  the wrong elements) is dropped before any timing.
* Each is timed as a CUDA graph runs it: runs back to back, cycling through copies of
  the weight that fill more than twice the L2 (``cold_copies``: each run reads its weight
  from HBM, as a decode step reads each layer's), the host's launches queued behind a GPU
  sleep (Triton's launch cost is larger than cuBLAS's; a graph replay has none). Timing
  each run alone after an L2 flush, as before 2026-12-04, measured the flush's write-back
  and idle clocks more than the kernels.
* The candidates are timed in rounds, every candidate once a round, so the GPU's clocks
  falling under sustained load slow them alike, not the last ones (an H200 start-up that
  timed them one after another kept cuBLAS everywhere against a sweep's 0.91-0.93x).
* A tile is kept only where it takes at most ``margin`` x the unfused ops' time.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

import torch

log = logging.getLogger(__name__)

TIMING_RUNS = 7
BACK_TO_BACK = 8  # runs per timing, one after another as in a graph replay
MAX_COPIES = 8  # of a weight to time on, to read it from HBM each run
SLEEP_CYCLES = 2_000_000  # ~1 ms at H200 clocks: the host queues the runs meanwhile
T = TypeVar("T")


def fastest(
    tiles: Sequence[T],
    unfused: Callable[[torch.Tensor], object],
    fused: Callable[[T, torch.Tensor], object],
    weights: list[torch.Tensor],
    margin: float,
) -> T | None:
    """The tile whose ``fused`` run beats ``margin`` x the ``unfused`` run's time and every
    other tile's, or None (the unfused ops); a tile that fails to run, or whose output is
    not the unfused ops' (``same_output``), is skipped. The candidates are timed in rounds,
    each round every one once, so that the GPU's clocks falling under sustained load (a
    prefill's GEMMs) slow them alike, not the last ones."""
    expected = unfused(weights[0])
    runnable: list[tuple[T, Callable[[torch.Tensor], object]]] = []
    for tile in tiles:
        run = partial(fused, tile)
        try:
            got = run(weights[0])  # compiles; raises for a tile this GPU cannot run
        except Exception as error:
            log.warning("kernel tile %s failed: %s", tile, error)
            continue
        if not same_output(got, expected):
            log.warning("kernel tile %s: output differs from the unfused ops'", tile)
            continue
        runnable.append((tile, run))
    if not runnable:
        return None
    took = _times([unfused] + [run for _, run in runnable], weights)
    best, chosen = margin * took[0], None
    for (tile, _), time_ms in zip(runnable, took[1:], strict=True):
        if time_ms < best:
            best, chosen = time_ms, tile
    return chosen


def same_output(got: object, expected: object, tolerance: float = 2e-2) -> bool:
    """Whether a candidate's output is the unfused ops' up to summation order: every
    element within ``tolerance`` x the largest magnitude (bf16 GEMMs summed in another
    order differ by a few ulps; a kernel that reads or writes the wrong elements differs
    by the values themselves). Outputs that are not tensors are not compared."""
    if not isinstance(got, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return True
    if got.shape != expected.shape:
        return False
    scale = expected.float().abs().max().item() if expected.numel() else 0.0
    worst = (got.float() - expected.float()).abs().max().item() if got.numel() else 0.0
    return bool(worst <= tolerance * scale)  # NaN anywhere: False


def cold_copies(weight: torch.Tensor) -> list[torch.Tensor]:
    """``weight`` and enough copies of it that cycling through them reads each from HBM
    (more than twice the L2 in all), as a decode step reads each layer's weights."""
    l2 = torch.cuda.get_device_properties(weight.device).L2_cache_size
    wanted = copies_wanted(weight.numel() * weight.element_size(), l2)
    copies = [weight]
    try:
        copies += [weight.clone() for _ in range(wanted - 1)]
    except torch.OutOfMemoryError:
        log.warning("kernel chooser: no room for %d copies of %s to time on", wanted, weight.shape)
    return copies


def copies_wanted(weight_bytes: int, l2_bytes: int) -> int:
    """How many of a weight (itself included) fill more than twice the L2: 1..MAX_COPIES."""
    return max(1, min(MAX_COPIES, -(-2 * l2_bytes // weight_bytes)))


def _time(run: Callable[[torch.Tensor], object], weights: list[torch.Tensor]) -> float:
    """``_times`` of one run (for benchmarks)."""
    return _times([run], weights)[0]


def _times(
    runs: list[Callable[[torch.Tensor], object]], weights: list[torch.Tensor]
) -> list[float]:
    """Median GPU ms of one run of each of ``runs`` as a CUDA graph runs it: back to back,
    cycling through ``weights`` (so each run reads its weight from HBM), with the host's
    launch cost hidden (Triton's is larger than cuBLAS's; a graph replay has none)."""
    runs[0](weights[0])  # picks cuBLAS's kernel (the others ran once already)
    count = max(BACK_TO_BACK, len(weights))
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(TIMING_RUNS):
        for run, times in zip(runs, samples, strict=True):
            torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for i in range(count):
                run(weights[i % len(weights)])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / count)
    return [float(statistics.median(times)) for times in samples]
