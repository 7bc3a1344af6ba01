"""GPU placement of ``dynask run``'s workers (issue 20), on a FAKE NVML inventory.

There is no GPU here: ``fake_nvml`` writes a ``pynvml`` module that lists made-up GPUs;
everything else (the placement, the CLI's refusal, real Dask worker processes started
with their ``CUDA_VISIBLE_DEVICES``, the workers' own GPU readings) is the real code.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from distributed import Client

from dynask.actors.runtime.gpu_discovery import (
    GPUInfo,
    discover_gpus,
    visible_gpus,
    worker_gpus,
)
from dynask.control_plane.cli.main import main
from dynask.control_plane.cluster.gpu_placement import (
    PinnedLocalCluster,
    WorkerPlacement,
    check_fractions,
    check_one_more,
    place_workers,
    placements_for_run,
)
from tests.control_plane.cluster.fake_nvml import install_fake_nvml

GIB = 2**30


@pytest.fixture
def fake_nvml_8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[GPUInfo]:
    """8 FAKE GPUs, seen by this process and by the worker processes it starts."""
    folder = install_fake_nvml(tmp_path / "fake_nvml", 8)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("PYTHONPATH", f"{folder}:{':'.join(sys.path)}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return discover_gpus()


def test_the_fake_inventory_is_read_through_nvml(fake_nvml_8: list[GPUInfo]) -> None:
    assert [g.index for g in fake_nvml_8] == list(range(8))
    assert fake_nvml_8[3] == GPUInfo(3, "FAKE GPU", 80 * GIB, 3 * GIB, 30, "GPU-fake-0003")


def test_eight_workers_on_eight_gpus_get_eight_distinct_devices(
    fake_nvml_8: list[GPUInfo],
) -> None:
    placements = place_workers(8, fake_nvml_8)
    assert [p.gpu for p in placements] == list(range(8))
    # Its own GPU first (cuda:0 in the worker), the others visible for CUDA IPC.
    assert placements[3].env == {"CUDA_VISIBLE_DEVICES": "3,0,1,2,4,5,6,7"}
    assert {p.fraction for p in placements} == {0.9}


def test_several_engines_per_gpu_go_round_robin_and_share_the_default_fraction(
    fake_nvml_8: list[GPUInfo],
) -> None:
    two_gpus = fake_nvml_8[:2]
    placements = place_workers(4, two_gpus, engines_per_gpu=2)
    assert [(p.worker, p.gpu, p.fraction) for p in placements] == [
        (0, 0, 0.45),
        (1, 1, 0.45),
        (2, 0, 0.45),
        (3, 1, 0.45),
    ]
    # An explicit fraction small enough says "share" without --engines-per-gpu.
    assert [p.gpu for p in place_workers(2, fake_nvml_8[:1], fraction=0.42)] == [0, 0]


def test_more_workers_than_gpus_is_refused_without_sharing(fake_nvml_8: list[GPUInfo]) -> None:
    with pytest.raises(ValueError) as refused:
        place_workers(9, fake_nvml_8)
    assert str(refused.value) == (
        "9 engine workers need 9 GPUs at 1 engine(s) per GPU; this host has 8. Share GPUs "
        "with --engines-per-gpu 2 (or a --gpu-memory-utilization whose engines add up to at "
        "most 1 per GPU), or start fewer workers"
    )


def test_fractions_that_overcommit_a_gpu_are_refused(fake_nvml_8: list[GPUInfo]) -> None:
    with pytest.raises(ValueError) as refused:
        place_workers(16, fake_nvml_8, engines_per_gpu=2, fraction=0.6)
    assert str(refused.value) == (
        "GPU 0 would hold 2 engines at gpu_memory_utilization 0.6 + 0.6 = 1.20 of its "
        "memory; the engines of one GPU must add up to at most 1 (e.g. "
        "--gpu-memory-utilization 0.5)"
    )
    prefill_and_decode = [WorkerPlacement(0, 5, "FAKE GPU", 0.3), WorkerPlacement(1, 5, "x", 0.7)]
    check_fractions(prefill_and_decode)  # exactly 1: allowed


def test_a_cpu_or_named_device_is_not_pinned(fake_nvml_8: list[GPUInfo]) -> None:
    assert placements_for_run(4, "cpu", fake_nvml_8, None, None) == []
    assert placements_for_run(4, "cuda:1", fake_nvml_8, None, None) == []
    assert placements_for_run(2, "auto", [], None, None) == []  # no GPU: nothing pinned


def test_visible_devices_select_the_workers_gpus(fake_nvml_8: list[GPUInfo]) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "6,GPU-fake-0002,bogus,1"}
    assert [g.index for g in visible_gpus(env, fake_nvml_8)] == [6, 2]
    assert len(visible_gpus({}, fake_nvml_8)) == 8


def test_a_worker_added_later_is_checked_round_robin_beside_the_running_ones(
    fake_nvml_8: list[GPUInfo],
) -> None:
    shared = place_workers(2, fake_nvml_8[:1], fraction=0.3)
    check_one_more(shared, [0, 1], 2)  # 0.3 x 3 = 0.9 of GPU 0: room
    with pytest.raises(ValueError, match=r"GPU 0 would hold 4 engines .* = 1\.20 of its memory"):
        check_one_more(shared, [0, 1, 2], 3)
    own = place_workers(8, fake_nvml_8)  # one engine per GPU at 0.9
    check_one_more(own, [0, 1, 2, 3, 4, 5, 6], 7)  # worker 7 retired, started again
    with pytest.raises(ValueError, match=r"GPU 1 would hold 2 engines at .* 0\.9 \+ 0\.9"):
        check_one_more(own, [1, 2, 3, 4, 5, 6, 7], 9)  # after a retire: name 9 -> GPU 1


def test_dynask_run_refuses_an_overcommitted_gpu_before_any_worker_starts(
    fake_nvml_8: list[GPUInfo], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--workers", "9", "--port", "0"])
    assert code != 0
    assert "9 engine workers need 9 GPUs at 1 engine(s) per GPU; this host has 8" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_real_worker_processes_each_hold_their_own_gpu(fake_nvml_8: list[GPUInfo]) -> None:
    placements = place_workers(8, fake_nvml_8)

    async def readings() -> dict[str, list[dict[str, object]]]:
        async with PinnedLocalCluster(
            placements,
            threads_per_worker=1,
            processes=True,
            asynchronous=True,
            dashboard_address=None,
        ) as cluster:
            await cluster.scale(8)
            async with Client(cluster, asynchronous=True) as client:
                await client.wait_for_workers(8)
                found: dict[str, list[dict[str, object]]] = await client.run(worker_gpus)
                return found

    found = asyncio.run(readings())
    held = sorted(gpu["index"] for gpus in found.values() for gpu in gpus)  # type: ignore[type-var]
    assert held == list(range(8))
    assert all(len(gpus) == 1 for gpus in found.values())
