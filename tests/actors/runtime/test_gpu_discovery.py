"""GPU discovery never crashes a worker: no NVIDIA library means an empty list."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from dynask.actors.runtime.gpu_discovery import (
    PLUGIN_NAME,
    GPUDiscoveryPlugin,
    discover_gpus,
    worker_gpus,
)

no_gpu_here = pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")


@no_gpu_here
def test_no_gpu_is_reported_as_an_empty_list() -> None:
    assert discover_gpus() == []


@no_gpu_here
def test_the_worker_plugin_records_no_gpu_on_a_real_worker() -> None:
    async def main() -> tuple[object, object]:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True) as client,
        ):
            await client.register_plugin(GPUDiscoveryPlugin())
            recorded = await client.run(lambda dask_worker: dask_worker.extensions[PLUGIN_NAME])
            fresh = await client.run(worker_gpus)
            return list(recorded.values()), list(fresh.values())

    assert asyncio.run(main()) == ([[]], [[]])
