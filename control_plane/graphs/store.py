"""Graphs in the database: stored when served, read by the admin UI."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dynask.control_plane.graphs.config import GraphPlan
from dynask.control_plane.state.models import GraphRow, utcnow


def store_graph(engine: Engine, plan: GraphPlan) -> None:
    """Inserts the graph, or replaces the one of the same name (served again)."""
    with Session(engine) as session, session.begin():
        row = session.scalar(select(GraphRow).where(GraphRow.name == plan.name))
        if row is None:
            row = GraphRow(name=plan.name)
            session.add(row)
        row.target = plan.target
        row.description = plan.description
        row.config = _json_safe(plan.config)
        row.created_at = utcnow()


def stored_graphs(engine: Engine) -> list[dict[str, Any]]:
    with Session(engine) as session:
        rows = session.scalars(select(GraphRow).order_by(GraphRow.name)).all()
        return [
            {"name": r.name, "target": r.target, **r.description, "created_at": r.created_at}
            for r in rows
        ]


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
