"""API keys stored hashed, and ``dynask keys create | list | revoke`` on both databases."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine, select

from dynask.control_plane.cli.main import main
from dynask.control_plane.state.api_keys import (
    ApiKeyNotFoundError,
    ApiKeys,
    KeyTenant,
    TenantLimits,
    hash_key,
)
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.models import ApiKeyRow
from dynask.control_plane.state.repository import Repository

KEY = re.compile(r"dsk_[A-Za-z0-9_-]{43}")


def _keys(capsys: pytest.CaptureFixture[str], db_url: str, *argv: str) -> tuple[int, str, str]:
    code = main(["keys", *argv, "--database-url", db_url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_create_list_revoke(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _keys(capsys, db_url, "create", "ci")
    key = out.strip()
    assert code == 0 and KEY.fullmatch(key), out
    assert f"created API key {key[:12]}… ('ci'; no limits, priority normal); it is shown" in err

    code, out, _ = _keys(capsys, db_url, "list")
    header, row = out.strip().splitlines()
    assert header.split() == [
        "ID", "PREFIX", "NAME", "CREATED", "LAST", "USED", "STATE", "LIMITS"
    ]  # fmt: skip
    assert row.split()[:3] == ["1", key[:12], "ci"]
    assert row.split()[-6:] == ["-", "active", "no", "limits,", "priority", "normal"]

    code, out, _ = _keys(capsys, db_url, "revoke", key[:12])
    assert (code, out) == (0, f"revoked API key {key[:12]}… ('ci')\n")
    code, _, err = _keys(capsys, db_url, "revoke", "1")
    assert code == 2 and f"API key {key[:12]}… ('ci') is already revoked" in err
    code, _, err = _keys(capsys, db_url, "revoke", "dsk_nothere")
    assert code == 2 and "API key 'dsk_nothere' is not known; `dynask keys list`" in err

    engine = make_engine(db_url)
    try:
        [stored] = Repository(engine).recent_events(1)
        assert ApiKeys(engine).active_hashes() == frozenset()
        with engine.connect() as connection:
            [hash_] = connection.scalars(select(ApiKeyRow.key_hash))
    finally:
        engine.dispose()
    assert (stored.kind, stored.who, stored.subject) == ("api_key.revoked", "cli", "ci")
    assert hash_ == hash_key(key) and key not in hash_  # only the hash is stored


def test_cli_sets_and_shows_tenant_limits(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _keys(
        capsys, db_url, "create", "batch", "--requests-per-s", "2.5", "--priority", "low"
    )
    key = out.strip()
    assert code == 0 and "('batch'; 2.5 req/s, priority low)" in err

    code, out, _ = _keys(
        capsys, db_url, "limits", "1", "--max-concurrent", "3", "--tokens-per-minute", "9000"
    )
    assert (code, out) == (
        0,
        f"API key {key[:12]}… ('batch'): 3 concurrent, 9000 tokens/min, priority normal\n",
    )
    code, _, err = _keys(capsys, db_url, "limits", "1", "--max-concurrent", "0")
    assert code == 2 and "TenantLimits 'max_concurrent' has value 0" in err

    engine = make_engine(db_url)
    try:
        [tenant] = ApiKeys(engine).active_tenants().values()
        [event] = Repository(engine).recent_events(1)
    finally:
        engine.dispose()
    assert tenant == KeyTenant(f"batch ({key[:12]})", TenantLimits(None, 3, 9000, "normal"))
    assert (event.kind, event.details["limits"]) == (
        "api_key.limits",
        "3 concurrent, 9000 tokens/min, priority normal",
    )


def test_cli_list_of_no_keys(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _keys(capsys, f"sqlite:///{tmp_path / 'k.db'}", "list")
    assert (code, out) == (0, "no API keys; create one with `dynask keys create NAME`\n")


def test_store_revokes_by_full_key_and_refuses_bad_names(db_engine: Engine) -> None:
    upgrade(db_engine)
    keys = ApiKeys(db_engine)
    first, second = keys.create("  app  ", "admin"), keys.create("other", "admin")
    assert first.record.name == "app" and first.key != second.key
    assert keys.active_hashes() == {hash_key(first.key), hash_key(second.key)}
    assert keys.revoke(first.key, "admin").revoked_at is not None
    assert keys.active_hashes() == {hash_key(second.key)}
    assert [k.name for k in keys.list()] == ["other", "app"]
    with pytest.raises(ValueError, match="API key 'name' has value ''; expected 1-64"):
        keys.create("", "admin")
    with pytest.raises(ApiKeyNotFoundError):
        keys.revoke("999", "admin")
