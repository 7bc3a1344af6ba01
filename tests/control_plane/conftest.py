"""Fixtures of the control-plane tests (defined in ``db_fixtures`` and ``conftest_server``)."""

from tests.control_plane.conftest_server import echo_server, tiny_server
from tests.control_plane.db_fixtures import db_engine, db_url, repo

__all__ = ["db_engine", "db_url", "echo_server", "repo", "tiny_server"]
