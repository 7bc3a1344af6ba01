"""Stored responses of the Responses API, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Engine

from dynask.control_plane.state.database import upgrade
from dynask.control_plane.state.response_store import ResponseStore, StoredResponse


def test_save_get_delete(db_engine: Engine) -> None:
    upgrade(db_engine)
    store = ResponseStore(db_engine)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    store.save("resp_1", "m", None, conversation, {"id": "resp_1", "output": []})
    assert store.get("resp_1") == StoredResponse(
        "resp_1", "m", conversation, {"id": "resp_1", "output": []}
    )
    assert store.get("resp_2") is None
    assert store.delete("resp_1") is True
    assert store.delete("resp_1") is False
    assert store.get("resp_1") is None
