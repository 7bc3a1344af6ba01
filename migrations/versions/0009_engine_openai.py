"""Deployments may run out=openai:URL (the URL kept in engine_file, as python's file).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Frozen like 0001: the engine lists are written out here, not imported.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = "'torch', 'vllm', 'mocker', 'echo', 'python'"
AFTER = "'torch', 'vllm', 'mocker', 'echo', 'python', 'openai'"
CHECK = "ck_deployments_engine_known"


def _engines(engines: str) -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_constraint(CHECK, type_="check")
        batch.create_check_constraint(CHECK, f"engine IN ({engines})")


def upgrade() -> None:
    _engines(AFTER)


def downgrade() -> None:
    op.execute("DELETE FROM deployments WHERE engine = 'openai'")
    _engines(BEFORE)
