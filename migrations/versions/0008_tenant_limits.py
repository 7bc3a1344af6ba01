"""Tenant limits on API keys: requests/s, concurrent requests, tokens/minute, priority.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("requests_per_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("max_concurrent", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tokens_per_minute", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("priority", sa.String(16), nullable=False, server_default="normal")
        )


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        for column in ("priority", "tokens_per_minute", "max_concurrent", "requests_per_s"):
            batch.drop_column(column)
