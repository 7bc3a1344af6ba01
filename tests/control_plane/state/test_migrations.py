"""The Alembic migrations on SQLite and PostgreSQL, and the models' agreement with them."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, MetaData, inspect, text

from dynask.control_plane.state import database
from dynask.control_plane.state.database import current_revision, downgrade, make_engine, upgrade
from dynask.control_plane.state.models import Base

HEAD = "0010"  # the newest revision
TABLES = {
    "alembic_version",
    "actor_instances",
    "admin_users",
    "api_keys",
    "deployments",
    "events",
    "graphs",
    "remote_workers",
    "responses",
}


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def _differences(engine: Engine, metadata: MetaData) -> list[object]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def test_a_new_database_has_no_revision(db_engine: Engine) -> None:
    assert current_revision(db_engine) is None
    assert _tables(db_engine) == set()


def test_upgrade_creates_exactly_the_tables(db_engine: Engine) -> None:
    upgrade(db_engine)
    assert _tables(db_engine) == TABLES
    assert current_revision(db_engine) == HEAD


def test_upgrade_by_url_opens_its_own_engine(db_url: str, db_engine: Engine) -> None:
    upgrade(db_url)
    assert current_revision(db_url) == HEAD
    assert _tables(db_engine) == TABLES


def test_upgrade_is_idempotent(db_engine: Engine) -> None:
    upgrade(db_engine)
    upgrade(db_engine)
    assert _tables(db_engine) == TABLES
    assert current_revision(db_engine) == HEAD


def test_downgrade_to_base_removes_the_tables(db_engine: Engine) -> None:
    upgrade(db_engine)
    downgrade(db_engine, "base")
    assert _tables(db_engine) == {"alembic_version"}
    assert current_revision(db_engine) is None


def test_the_models_match_the_migrations(db_engine: Engine) -> None:
    upgrade(db_engine)
    assert _differences(db_engine, Base.metadata) == []


def test_the_comparison_sees_a_column_the_migrations_lack(db_engine: Engine) -> None:
    upgrade(db_engine)
    changed = MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["deployments"].append_column(Column("zone", Integer))
    [difference] = _differences(db_engine, changed)
    assert difference[0] == "add_column"  # type: ignore[index]
    assert difference[3].name == "zone"  # type: ignore[index]


def test_sqlite_engines_enforce_foreign_keys(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'deep' / 'folder' / 'x.db'}")
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()
    assert (tmp_path / "deep" / "folder" / "x.db").is_file()


def test_default_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(database.DATABASE_URL_VARIABLE, "postgresql+psycopg://u@h/db")
    assert database.default_database_url() == "postgresql+psycopg://u@h/db"


def test_default_url_is_a_file_in_the_data_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(database.DATABASE_URL_VARIABLE, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    url = database.default_database_url()
    assert url == f"sqlite:///{tmp_path}/.local/share/dynask/dynask.db"
    assert (tmp_path / ".local" / "share" / "dynask").is_dir()


def test_default_url_follows_xdg_data_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(database.DATABASE_URL_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert database.default_database_url() == f"sqlite:///{tmp_path}/data/dynask/dynask.db"
