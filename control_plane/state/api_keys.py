"""Keys of the OpenAI API: created, listed and revoked; stored as a SHA-256 hash.

Design decisions:
- A key is ``dsk_`` and 32 random bytes (``secrets.token_urlsafe``): 256 bits of
  entropy. Guessing one is hopeless whatever the hash's speed, so a plain SHA-256 is
  enough, where a password needs a slow salted hash (scrypt in ``admin_users``). A fast
  hash is what lets the guard check a request with one hash and one dict lookup (~1 µs)
  instead of ~50 ms of scrypt per request. The lookup is by hash, so no timing of a
  string comparison against the secret can leak it.
- The key itself is shown once, when it is made, and never stored. Its first
  ``PREFIX_LENGTH`` characters are kept to tell keys apart in lists and to revoke one.
- Revoking keeps the row (``revoked_at``): the event log and the list still name it.
- Every change logs its event (``api_key.created`` / ``api_key.revoked`` /
  ``api_key.limits``) in the same transaction, like the deployment changes in
  ``repository``.
- A key carries its tenant's limits (``TenantLimits``: requests/s, concurrent requests,
  tokens/minute, priority class); ``serving.tenants`` enforces them.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NewType

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from dynask.control_plane.state.models import ApiKeyRow, EventRow, utcnow
from dynask.control_plane.state.repository import NotFoundError

KeyHash = NewType("KeyHash", str)
KEY_PREFIX = "dsk_"
PREFIX_LENGTH = 12  # "dsk_" and 8 characters: 48 random bits, unique in practice
MAX_NAME_LENGTH = 64
PRIORITIES = ("high", "normal", "low")


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's limits (None: unlimited) and priority class; validated on construction."""

    requests_per_s: float | None = None
    max_concurrent: int | None = None
    tokens_per_minute: int | None = None  # prompt + max_tokens, counted at admission
    priority: str = "normal"

    def __post_init__(self) -> None:
        rate = self.requests_per_s
        if rate is not None and (isinstance(rate, bool) or not rate > 0):
            raise ValueError(f"TenantLimits 'requests_per_s' has value {rate!r}; expected > 0")
        for name in ("max_concurrent", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"TenantLimits '{name}' has value {value!r}; expected an integer >= 1"
                )
        if self.priority not in PRIORITIES:
            raise ValueError(
                f"TenantLimits 'priority' has value {self.priority!r}; expected one of "
                + ", ".join(PRIORITIES)
            )

    def describe(self) -> str:
        """``5 req/s, 2 concurrent, 10000 tokens/min, priority high`` (or ``no limits``)."""
        parts = [
            f"{self.requests_per_s:g} req/s" if self.requests_per_s else "",
            f"{self.max_concurrent} concurrent" if self.max_concurrent else "",
            f"{self.tokens_per_minute} tokens/min" if self.tokens_per_minute else "",
        ]
        limits = ", ".join(p for p in parts if p) or "no limits"
        return f"{limits}, priority {self.priority}"


@dataclass(frozen=True)
class KeyTenant:
    """Who a valid key belongs to, as the request path needs it."""

    name: str  # the tenant's name in metrics: the key's name and prefix
    limits: TenantLimits


class ApiKeyNotFoundError(NotFoundError):
    """No key has that id or prefix."""


def hash_key(key: str) -> KeyHash:
    """The stored form of ``key``: its SHA-256, in hex."""
    return KeyHash(hashlib.sha256(key.encode()).hexdigest())


def new_key() -> str:
    """A fresh random key (``dsk_`` + 43 URL-safe characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ApiKey:
    """A key as stored (without its hash)."""

    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    limits: TenantLimits = field(default_factory=TenantLimits)

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class CreatedKey:
    """A new key's record and the key itself, to be shown once."""

    record: ApiKey
    key: str


def check_key_name(name: str) -> str:
    """The name stripped; ValueError unless it is 1-64 characters long."""
    stripped = name.strip() if isinstance(name, str) else ""
    if not 0 < len(stripped) <= MAX_NAME_LENGTH:
        raise ValueError(
            f"API key 'name' has value {name!r}; expected 1-{MAX_NAME_LENGTH} characters, "
            "e.g. the team or app that uses it"
        )
    return stripped


class ApiKeys:
    """The API keys in the database (migrated by ``database.upgrade``)."""

    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def create(self, name: str, who: str, limits: TenantLimits | None = None) -> CreatedKey:
        """Stores a new key called ``name``; the result holds the key, shown once."""
        name = check_key_name(name)
        key = new_key()
        with self._sessions.begin() as session:
            row = ApiKeyRow(
                name=name, prefix=key[:PREFIX_LENGTH], key_hash=hash_key(key), created_at=utcnow()
            )
            _set_limits(row, limits or TenantLimits())
            session.add(row)
            session.flush()
            _log(session, who, "api_key.created", row)
            return CreatedKey(_record(row), key)

    def list(self) -> list[ApiKey]:
        """All keys, the newest first, revoked ones included."""
        with self._sessions.begin() as session:
            rows = session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id.desc()))
            return [_record(row) for row in rows]

    def revoke(self, prefix_or_id: str, who: str) -> ApiKey:
        """Revokes the key with that id, display prefix or full value."""
        with self._sessions.begin() as session:
            row = _find(session, prefix_or_id.strip())
            if row.revoked_at is not None:
                raise ValueError(f"API key {row.prefix}… ({row.name!r}) is already revoked")
            row.revoked_at = utcnow()
            _log(session, who, "api_key.revoked", row)
            return _record(row)

    def set_limits(self, prefix_or_id: str, limits: TenantLimits, who: str) -> ApiKey:
        """Replaces the tenant limits of the key with that id, display prefix or value."""
        with self._sessions.begin() as session:
            row = _find(session, prefix_or_id.strip())
            _set_limits(row, limits)
            _log(session, who, "api_key.limits", row)
            return _record(row)

    def active_tenants(self) -> dict[KeyHash, KeyTenant]:
        """The keys not revoked, by hash, with their tenant limits."""
        query = select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))
        with self._sessions.begin() as session:
            return {
                KeyHash(row.key_hash): KeyTenant(f"{row.name} ({row.prefix})", _limits(row))
                for row in session.scalars(query)
            }

    def active_hashes(self) -> frozenset[KeyHash]:
        """The hashes of the keys not revoked."""
        query = select(ApiKeyRow.key_hash).where(ApiKeyRow.revoked_at.is_(None))
        with self._sessions.begin() as session:
            return frozenset(KeyHash(h) for h in session.scalars(query))

    def mark_used(self, hashes: Iterable[KeyHash], at: datetime) -> None:
        """Sets ``last_used_at`` of the keys with these hashes (one UPDATE)."""
        chosen = list(hashes)
        if not chosen:
            return
        with self._sessions.begin() as session:
            session.execute(
                update(ApiKeyRow).where(ApiKeyRow.key_hash.in_(chosen)).values(last_used_at=at)
            )


def _find(session: Session, prefix_or_id: str) -> ApiKeyRow:
    if prefix_or_id.isdigit():
        criterion = ApiKeyRow.id == int(prefix_or_id)
    elif len(prefix_or_id) > PREFIX_LENGTH:  # the whole key
        criterion = ApiKeyRow.key_hash == hash_key(prefix_or_id)
    else:
        criterion = ApiKeyRow.prefix == prefix_or_id
    rows = list(session.scalars(select(ApiKeyRow).where(criterion)))
    if not rows:
        raise ApiKeyNotFoundError(
            f"API key {prefix_or_id!r} is not known; `dynask keys list` shows the ids and prefixes"
        )
    if len(rows) > 1:
        raise ValueError(f"API key prefix {prefix_or_id!r} is ambiguous; revoke by id instead")
    return rows[0]


def _log(session: Session, who: str, kind: str, row: ApiKeyRow) -> None:
    details: dict[str, object] = {"id": row.id, "prefix": row.prefix}
    if kind != "api_key.revoked":
        details["limits"] = _limits(row).describe()
    session.add(EventRow(at=utcnow(), who=who, kind=kind, subject=row.name, details=details))


def _record(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        row.id,
        row.name,
        row.prefix,
        row.created_at,
        row.last_used_at,
        row.revoked_at,
        _limits(row),
    )


def _limits(row: ApiKeyRow) -> TenantLimits:
    return TenantLimits(
        row.requests_per_s, row.max_concurrent, row.tokens_per_minute, row.priority or "normal"
    )


def _set_limits(row: ApiKeyRow, limits: TenantLimits) -> None:
    row.requests_per_s = limits.requests_per_s
    row.max_concurrent = limits.max_concurrent
    row.tokens_per_minute = limits.tokens_per_minute
    row.priority = limits.priority
