"""Drop the ``workers`` table: it was written when an actor started and never read.

Workers are observed live from the Dask scheduler (the admin UI's workers page, the
reconciler's placement); an actor instance keeps its worker's address. The table's
``mark_worker_gone``/``list_workers`` path was never called in production, so it went.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("workers")


def downgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workers"),
        sa.UniqueConstraint("address", name="uq_workers_address"),
        sa.CheckConstraint("status IN ('alive', 'gone')", name="ck_workers_status_known"),
    )
