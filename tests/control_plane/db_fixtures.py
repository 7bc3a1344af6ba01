"""Database fixtures: every test gets an empty database on SQLite and on PostgreSQL.

SQLite: a file in the test's tmp folder. PostgreSQL (``DYNASK_TEST_POSTGRES_URL``, default
the local server): a fresh schema per test, chosen through the URL's ``options`` query
(``-csearch_path=t_<uuid>``) so that even ``upgrade(url)`` stays inside it, and dropped
afterwards. When no server answers, the PostgreSQL variants fail and say so: they are
required, not optional.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.repository import Repository

POSTGRES_URL = os.environ.get(
    "DYNASK_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("sqlite", "postgresql")


def _postgres_schema_url() -> Iterator[str]:
    admin = make_engine(POSTGRES_URL, poolclass=NullPool)
    schema = f"t_{uuid.uuid4().hex}"
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as error:
        admin.dispose()
        pytest.fail(
            f"PostgreSQL at {POSTGRES_URL} is not reachable ({error}); start it (.ci/run does) "
            "or point DYNASK_TEST_POSTGRES_URL at one"
        )
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database (no tables), SQLite or PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dynask.db'}"
    else:
        yield from _postgres_schema_url()


@pytest.fixture
def db_engine(db_url: str) -> Iterator[Engine]:
    """An Engine on the empty database; disposed before the database goes away."""
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def repo(db_engine: Engine) -> Repository:
    """A Repository over a database migrated to head."""
    upgrade(db_engine)
    return Repository(db_engine)
