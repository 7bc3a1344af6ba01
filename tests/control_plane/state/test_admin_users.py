"""Admin accounts: scrypt hashes, the first account, logins (SQLite and PostgreSQL)."""

from __future__ import annotations

import io

import pytest

from dynask.control_plane.cli.main import main
from dynask.control_plane.state.admin_users import AdminUsers, hash_password, verify_password
from dynask.control_plane.state.database import make_engine, upgrade
from dynask.control_plane.state.repository import Repository


def test_a_hash_verifies_only_its_password() -> None:
    stored = hash_password("s3cret-pass")
    scheme, n, r, p, _salt, _digest = stored.split("$")
    assert (scheme, n, r, p) == ("scrypt", "16384", "8", "1")
    assert "s3cret-pass" not in stored
    assert verify_password("s3cret-pass", stored)
    assert not verify_password("s3cret-pasS", stored)
    assert hash_password("s3cret-pass") != stored  # a new salt each time


@pytest.mark.parametrize("stored", ["", "plain", "md5$1$2$3$4$5", "scrypt$x$8$1$AA==$AA=="])
def test_a_malformed_hash_never_verifies(stored: str) -> None:
    assert not verify_password("anything", stored)


def test_the_admin_is_created_once_and_a_later_password_is_applied(repo: Repository) -> None:
    users = AdminUsers(repo.engine)
    made = users.ensure_admin("first-password")
    assert (made.created, made.generated_password, made.user.username) == (True, None, "admin")
    same = users.ensure_admin("first-password")
    assert (same.created, same.password_changed) == (False, False)
    # DYNASK_ADMIN_PASSWORD set after the first start: applied, and said so.
    again = users.ensure_admin("other-password")
    assert (again.created, again.password_changed, again.user.id) == (False, True, made.user.id)
    assert users.authenticate("admin", "first-password") is None
    assert users.authenticate("admin", "other-password") is not None
    assert users.ensure_admin(None).password_changed is False  # unset: left alone


def test_cli_set_password_reads_stdin(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        AdminUsers(engine).ensure_admin("first-password")
        monkeypatch.setattr("sys.stdin", io.StringIO("new-password-1\n"))
        code = main(["admin", "set-password", "--database-url", db_url])
        assert (code, capsys.readouterr().out) == (
            0,
            "dynask: the admin UI account 'admin' has a new password\n",
        )
        assert AdminUsers(engine).authenticate("admin", "new-password-1") is not None
        monkeypatch.setattr("sys.stdin", io.StringIO("x\n"))
        assert main(["admin", "set-password", "nobody", "--database-url", db_url]) == 2
        assert "Admin 'password' is 1 characters long" in capsys.readouterr().err
    finally:
        engine.dispose()


def test_without_a_password_one_is_generated(repo: Repository) -> None:
    users = AdminUsers(repo.engine)
    made = users.ensure_admin(None)
    assert made.created and made.generated_password is not None
    assert len(made.generated_password) >= 16
    assert users.authenticate("admin", made.generated_password) is not None


def test_a_login_is_noted(repo: Repository) -> None:
    users = AdminUsers(repo.engine)
    users.ensure_admin("first-password")
    assert users.get("admin").last_login_at is None  # type: ignore[union-attr]
    user = users.authenticate("admin", "first-password")
    assert user is not None and user.last_login_at is not None
    assert users.authenticate("nobody", "first-password") is None


def test_a_short_password_is_refused(repo: Repository) -> None:
    with pytest.raises(
        ValueError, match="Admin 'password' is 5 characters long; expected at least 8"
    ):
        AdminUsers(repo.engine).ensure_admin("short")


def test_a_name_is_taken_once(repo: Repository) -> None:
    users = AdminUsers(repo.engine)
    users.create("ops", "long-enough")
    with pytest.raises(ValueError, match="Admin 'ops' already exists"):
        users.create("ops", "long-enough")
