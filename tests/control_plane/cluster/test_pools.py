"""Pool membership and placement, exactly (``dyn://POOL``)."""

from __future__ import annotations

import pytest

from dynask.control_plane.cluster.placement_rules import may_place
from dynask.control_plane.cluster.pools import PoolPlacement, in_pool, pool_name, worker_name
from dynask.control_plane.state.deployment import DeploymentSpec


def test_pool_addresses() -> None:
    assert pool_name("dyn://llama") == "llama"
    with pytest.raises(ValueError, match="'dyn://' is not a pool address; use dyn://POOL"):
        pool_name("dyn://")
    with pytest.raises(ValueError, match="Deployment 'name' has value 'Llama'"):
        pool_name("dyn://Llama")


def test_a_pool_never_takes_another_pools_workers() -> None:
    assert worker_name("llama", "node-1-0") == "dyn-llama.node-1-0"
    assert in_pool("dyn-llama.node-1-0", "llama")
    assert not in_pool("dyn-llama-2.node-1-0", "llama")  # pool llama-2, not llama
    assert not in_pool("remote-1-host-gpu0", "llama")


def _worker(name: str) -> dict[str, object]:
    return {"address": f"tcp://{name}:1", "name": name}


def test_a_pool_has_one_replica_per_worker_and_only_there() -> None:
    placement = PoolPlacement(["llama"])
    pool = DeploymentSpec("llama", engine="echo", replicas=0)
    other = DeploymentSpec("other", engine="echo", replicas=1)
    workers = [_worker("dyn-llama.a-0"), _worker("dyn-llama.b-0"), _worker("0")]
    wanted = placement.wanted([pool, other], workers)
    assert [(d.name, d.replicas) for d in wanted] == [("llama", 2), ("other", 1)]
    assert [may_place(pool, w, placement.pools) for w in workers] == [True, True, False]
    assert [may_place(other, w, placement.pools) for w in workers] == [False, False, True]
