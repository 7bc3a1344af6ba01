"""Accounts of the admin UI: passwords hashed with scrypt, the first account made on start.

Design decisions:
- The standard library's ``hashlib.scrypt`` (n=2**14, r=8, p=1, a 16-byte random salt):
  memory-hard, no new dependency. The stored form names its parameters
  (``scrypt$n$r$p$salt$hash``), so they can be raised later without breaking old hashes.
- A wrong user name and a wrong password take the same path (a hash is computed for a
  dummy account too), so the answer's timing does not tell which one was wrong.
- ``ensure_admin`` runs on every start but creates the account only once; a generated
  password is returned once to be printed, and never stored in clear. A password given
  (``$DYNASK_ADMIN_PASSWORD``) that differs from the stored one is applied, and the caller
  says so: setting the variable after the first start must not silently do nothing.
- ``set_password`` (``dynask admin set-password``) changes a password without a start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from dynask.control_plane.state.models import AdminUserRow, utcnow

ADMIN_USERNAME = "admin"
ADMIN_PASSWORD_VARIABLE = "DYNASK_ADMIN_PASSWORD"
MIN_PASSWORD_LENGTH = 8
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1


def hash_password(password: str) -> str:
    """A salted scrypt hash of ``password`` in the form ``scrypt$n$r$p$salt$hash``."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P)
    return "$".join(["scrypt", str(_SCRYPT_N), str(_SCRYPT_R), str(_SCRYPT_P), _b64(salt), digest])


def verify_password(password: str, stored: str) -> bool:
    """True if ``password`` hashes to ``stored`` (constant-time comparison)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        computed = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(computed, digest)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> str:
    raw = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 2**20, dklen=32)
    return _b64(raw)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


_DUMMY_HASH = hash_password(secrets.token_urlsafe(16))  # for unknown names (same timing)


@dataclass(frozen=True)
class AdminUser:
    """An admin account as stored (without its hash)."""

    id: int
    username: str
    created_at: datetime
    last_login_at: datetime | None


@dataclass(frozen=True)
class CreatedAdmin:
    """What ``ensure_admin`` did: the account, and the password if it generated one."""

    user: AdminUser
    created: bool
    generated_password: str | None = None
    password_changed: bool = False  # an existing account took the password given


class AdminUsers:
    """The admin accounts in the database (migrated by ``database.upgrade``)."""

    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def create(self, username: str, password: str) -> AdminUser:
        """Stores a new account; ValueError if the name is taken or the password too short."""
        _check_password(password)
        try:
            with self._sessions.begin() as session:
                row = AdminUserRow(
                    username=username, password_hash=hash_password(password), created_at=utcnow()
                )
                session.add(row)
                session.flush()
                return _user(row)
        except IntegrityError as error:
            raise ValueError(f"Admin {username!r} already exists") from error

    def get(self, username: str) -> AdminUser | None:
        with self._sessions.begin() as session:
            row = session.scalar(select(AdminUserRow).where(AdminUserRow.username == username))
            return None if row is None else _user(row)

    def authenticate(self, username: str, password: str) -> AdminUser | None:
        """The account if ``password`` is right (and its login time noted), else None."""
        with self._sessions.begin() as session:
            row = session.scalar(select(AdminUserRow).where(AdminUserRow.username == username))
            if not verify_password(password, _DUMMY_HASH if row is None else row.password_hash):
                return None
            assert row is not None  # the dummy hash never verifies
            row.last_login_at = utcnow()
            return _user(row)

    def _verifies(self, username: str, password: str) -> bool:
        """``password`` is the account's (no login noted)."""
        with self._sessions.begin() as session:
            row = session.scalar(select(AdminUserRow).where(AdminUserRow.username == username))
            return row is not None and verify_password(password, row.password_hash)

    def set_password(self, username: str, password: str) -> AdminUser:
        """Replaces the account's password; ValueError if it is unknown or too short."""
        _check_password(password)
        with self._sessions.begin() as session:
            row = session.scalar(select(AdminUserRow).where(AdminUserRow.username == username))
            if row is None:
                raise ValueError(f"Admin {username!r} does not exist")
            row.password_hash = hash_password(password)
            return _user(row)

    def ensure_admin(self, password: str | None) -> CreatedAdmin:
        """Creates the ``admin`` account once, with ``password`` or a generated one; on
        later starts applies ``password`` if it is not the stored one."""
        existing = self.get(ADMIN_USERNAME)
        if existing is not None:
            if password and not self._verifies(ADMIN_USERNAME, password):
                user = self.set_password(ADMIN_USERNAME, password)
                return CreatedAdmin(user, created=False, password_changed=True)
            return CreatedAdmin(existing, created=False)
        generated = None if password else secrets.token_urlsafe(12)
        try:
            user = self.create(ADMIN_USERNAME, password or str(generated))
        except ValueError:
            raced = self.get(ADMIN_USERNAME)  # another control plane made it meanwhile
            if raced is None:
                raise
            return CreatedAdmin(raced, created=False)
        return CreatedAdmin(user, created=True, generated_password=generated)


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValueError(
            f"Admin 'password' is {len(password)} characters long; "
            f"expected at least {MIN_PASSWORD_LENGTH}"
        )


def _user(row: AdminUserRow) -> AdminUser:
    return AdminUser(row.id, row.username, row.created_at, row.last_login_at)
