"""Responses of the Responses API kept in the database (``store: true``).

A stored response keeps the object the API returned (for ``GET /v1/responses/{id}``) and
the whole conversation up to and including its output as chat messages, so a request
with ``previous_response_id`` continues from one row instead of walking the chain.
Blocking calls: the routes run them in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session, sessionmaker

from dynask.control_plane.state.models import ResponseRow


@dataclass(frozen=True)
class StoredResponse:
    id: str
    model: str
    conversation: list[dict[str, Any]]
    body: dict[str, Any]


class ResponseStore:
    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def save(
        self,
        response_id: str,
        model: str,
        previous_response_id: str | None,
        conversation: list[dict[str, Any]],
        body: dict[str, Any],
    ) -> None:
        with self._sessions.begin() as session:
            session.add(
                ResponseRow(
                    id=response_id,
                    model=model,
                    previous_response_id=previous_response_id,
                    conversation=conversation,
                    body=body,
                )
            )

    def get(self, response_id: str) -> StoredResponse | None:
        with Session(self._sessions.kw["bind"]) as session:
            row = session.get(ResponseRow, response_id)
            if row is None:
                return None
            return StoredResponse(row.id, row.model, list(row.conversation), dict(row.body))

    def delete(self, response_id: str) -> bool:
        with self._sessions.begin() as session:
            result = session.execute(delete(ResponseRow).where(ResponseRow.id == response_id))
            return bool(getattr(result, "rowcount", 0))
