"""Fixtures of the control-plane tests (defined in ``db_fixtures``, ``conftest_server`` and
``dask_processes``)."""

from tests.control_plane.conftest_server import echo_server, tiny_server
from tests.control_plane.dask_processes import dask_cluster
from tests.control_plane.db_fixtures import db_engine, db_url, repo

__all__ = ["dask_cluster", "db_engine", "db_url", "echo_server", "repo", "tiny_server"]
