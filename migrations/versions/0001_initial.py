"""Initial schema: deployments, workers, actor instances, events.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand and frozen: it names every constraint and index and imports nothing of
the application, so it keeps producing the same schema as the models change later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENGINES = "'torch', 'vllm', 'mocker', 'echo', 'python'"
ROLES = "'aggregated', 'prefill', 'decode'"
WORKER_STATUSES = "'alive', 'gone'"
ACTOR_STATUSES = "'starting', 'ready', 'failed', 'stopped', 'lost'"


def _timestamp(name: str) -> sa.Column[sa.DateTime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("model", sa.String(1024), nullable=False),
        sa.Column("engine", sa.String(16), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("engine_args", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_deployments"),
        sa.UniqueConstraint("name", name="uq_deployments_name"),
        sa.CheckConstraint("replicas >= 0", name="ck_deployments_replicas_non_negative"),
        sa.CheckConstraint(f"engine IN ({ENGINES})", name="ck_deployments_engine_known"),
        sa.CheckConstraint(f"role IN ({ROLES})", name="ck_deployments_role_known"),
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _timestamp("last_seen"),
        sa.PrimaryKeyConstraint("id", name="pk_workers"),
        sa.UniqueConstraint("address", name="uq_workers_address"),
        sa.CheckConstraint(f"status IN ({WORKER_STATUSES})", name="ck_workers_status_known"),
    )
    op.create_table(
        "actor_instances",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("worker_address", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stream_address", sa.String(255), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_actor_instances"),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name="fk_actor_instances_deployment_id_deployments",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(f"status IN ({ACTOR_STATUSES})", name="ck_actor_instances_status_known"),
    )
    op.create_index("ix_actor_instances_deployment_id", "actor_instances", ["deployment_id"])
    op.create_index("ix_actor_instances_worker_address", "actor_instances", ["worker_address"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        _timestamp("at"),
        sa.Column("who", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_at", "events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_events_at", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_actor_instances_worker_address", table_name="actor_instances")
    op.drop_index("ix_actor_instances_deployment_id", table_name="actor_instances")
    op.drop_table("actor_instances")
    op.drop_table("workers")
    op.drop_table("deployments")
