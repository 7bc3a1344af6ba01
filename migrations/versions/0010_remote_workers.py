"""Workers on other hosts (started over SSH from the admin UI) are kept, so a restarted
control plane starts them again.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

Frozen like 0001: the allowed states are written out here, not imported.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "remote_workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("launch", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("ssh_user", sa.String(64), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("environment", sa.String(1024), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("who", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('starting', 'joined', 'failed', 'exited')",
            name="ck_remote_workers_state_known",
        ),
        sa.CheckConstraint("port >= 1 AND port <= 65535", name="ck_remote_workers_port_in_range"),
        sa.PrimaryKeyConstraint("id", name="pk_remote_workers"),
        sa.UniqueConstraint("name", name="uq_remote_workers_name"),
    )
    op.create_index("ix_remote_workers_launch", "remote_workers", ["launch"])


def downgrade() -> None:
    op.drop_index("ix_remote_workers_launch", table_name="remote_workers")
    op.drop_table("remote_workers")
