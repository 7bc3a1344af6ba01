"""Fixtures of the admin UI tests: an admin app over SQLite and an idle runtime."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynask.control_plane.state.admin_users import AdminUsers
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.repository import Repository
from tests.web.admin_stack import PASSWORD, AdminStack, log_in, make_stack


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file at the newest schema with the admin account (copied per test: the
    migrations and the password hash run once)."""
    path = tmp_path_factory.mktemp("template") / "admin.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    AdminUsers(engine).ensure_admin(PASSWORD)
    engine.dispose()
    return path


@pytest.fixture
def stack(migrated_database: Path, tmp_path: Path) -> Iterator[AdminStack]:
    path = Path(shutil.copy(migrated_database, tmp_path / "admin.db"))
    engine = make_engine(f"sqlite:///{path}")
    made = make_stack(Repository(engine))
    with made.client:
        yield made
    engine.dispose()


@pytest.fixture
def csrf(stack: AdminStack) -> str:
    """Logs the stack's client in; the session's CSRF token."""
    return log_in(stack.client)
