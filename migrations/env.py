"""Alembic environment: runs the revisions on a connection handed in, or on a URL.

``dynask.control_plane.state.database.upgrade`` hands its connection in through
``config.attributes["connection"]``; the ``alembic`` command line uses the config's
``sqlalchemy.url``. SQLite needs batch mode to alter tables (it rebuilds them).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from dynask.control_plane.state.database import make_engine
from dynask.control_plane.state.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    """Writes the SQL for the URL's dialect instead of running it."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=bool(url and url.startswith("sqlite")),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Runs the revisions on the handed-in connection, else on the config's URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as new_connection:
            _run_on(new_connection)
            new_connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
