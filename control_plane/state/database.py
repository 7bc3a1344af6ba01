"""Database engines and schema migrations.

The schema comes only from the Alembic migrations in ``dynask.migrations`` (never
``create_all``); ``upgrade`` runs them programmatically, without an ``alembic.ini``.
SQLite is the default (one file per user); ``DYNASK_DATABASE_URL`` selects another
database, e.g. ``postgresql+psycopg://user@host/dynask``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, create_engine, event, make_url

import dynask.migrations

DATABASE_URL_VARIABLE = "DYNASK_DATABASE_URL"


def default_database_url() -> str:
    """``$DYNASK_DATABASE_URL``, else a SQLite file in the user's data folder.

    The folder is ``$XDG_DATA_HOME/dynask`` (``~/.local/share/dynask`` when unset); it is
    created here so that the URL can be opened at once.
    """
    url = os.environ.get(DATABASE_URL_VARIABLE)
    if url:
        return url
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    folder = Path(data_home) / "dynask"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'dynask.db'}"


def make_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """An Engine for ``url`` (default: ``default_database_url()``).

    For SQLite it creates the file's folder and turns foreign keys on for every
    connection (SQLite ignores ``ON DELETE CASCADE`` otherwise). ``kwargs`` go to
    ``sqlalchemy.create_engine``.
    """
    url = url or default_database_url()
    parsed = make_url(url)
    engine = create_engine(parsed, **kwargs)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        event.listen(engine, "connect", _enable_sqlite_foreign_keys)
    return engine


def _enable_sqlite_foreign_keys(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config built in code: our migrations folder and, if given, the URL."""
    config = Config()
    config.set_main_option("script_location", str(Path(dynask.migrations.__file__).parent))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _connection(target: str | Engine) -> Iterator[Connection]:
    """One transaction on ``target``; an Engine made here from a URL is disposed after."""
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        if isinstance(target, str):
            engine.dispose()


def upgrade(target: str | Engine, revision: str = "head") -> None:
    """Migrates the database at ``target`` (a URL or an Engine) up to ``revision``."""
    with _connection(target) as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(target: str | Engine, revision: str) -> None:
    """Migrates the database at ``target`` down to ``revision`` (``"base"``: empty)."""
    with _connection(target) as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current_revision(target: str | Engine) -> str | None:
    """The revision the database at ``target`` is at; None before the first migration."""
    with _connection(target) as connection:
        revision: str | None = MigrationContext.configure(connection).get_current_revision()
        return revision
