"""The API-key check on ``/v1/*``: ``Authorization: Bearer KEY`` or 401 in OpenAI's shape.

Design decisions:
- A request costs one SHA-256 of the key and one set lookup (a few µs), never a database
  query: the hashes of the keys not revoked are cached in memory and reloaded in a worker
  thread every ``refresh_s`` seconds, triggered by a request that finds them stale (the
  request does not wait). A revoked key is refused within ``refresh_s`` plus one query.
  Only the first request waits, for the first load.
- The key is ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (Anthropic's clients send
  that one); a 401 on ``/v1/messages`` is Anthropic-shaped.
- Only ``/v1`` and below are guarded: ``/health``, ``/live``, ``/metrics``,
  ``/openapi.json`` and ``/admin`` (its own login) stay open.
- The admin chat playground calls ``/v1/chat/completions`` from the browser. Its page
  carries a short-lived *session key* minted in memory by ``mint_session_key`` (never
  stored, gone on restart, valid as long as an admin session). The admin session cookie is
  scoped to ``/admin``, so accepting it on ``/v1`` would widen the cookie's path and make
  ``/v1`` a cookie-authenticated (CSRF-prone) endpoint; a bearer key keeps ``/v1`` a
  header-only API, and only a logged-in admin can see the page that holds one.
- When a key was used, its hash is noted (a set add) and ``last_used_at`` is written for
  all of them at the next refresh: one UPDATE per refresh, not per request.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from dynask.control_plane.api.errors import APIError
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.state.api_keys import (
    PREFIX_LENGTH,
    ApiKeys,
    KeyHash,
    KeyTenant,
    hash_key,
)

log = logging.getLogger(__name__)

REFRESH_S = 2.0
SESSION_KEY_TTL_S = 12 * 3600.0  # as long as an admin session lasts
MAX_SESSION_KEYS = 1024
_HOW = (
    "create one with `dynask keys create NAME --database-url URL` or on the admin UI's "
    "API keys page"
)
MISSING_KEY_MESSAGE = (
    "Missing API key: send it in the header 'Authorization: Bearer YOUR_KEY'; " + _HOW
)
INVALID_KEY_MESSAGE = (
    "Invalid API key: it was revoked or never issued; check the key you send as "
    "'Authorization: Bearer YOUR_KEY', or " + _HOW
)


class ApiKeyGuard:
    """The valid keys, as a cache of hashes refreshed from ``keys`` in the background."""

    def __init__(
        self,
        keys: ApiKeys,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not refresh_s >= 0:
            raise ValueError(f"ApiKeyGuard 'refresh_s' has value {refresh_s!r}; expected >= 0")
        self._keys = keys
        self._refresh_s = refresh_s
        self._clock = clock
        self._hashes: dict[KeyHash, KeyTenant] | None = None  # None: not loaded yet
        self._next_refresh = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._used: set[KeyHash] = set()
        self._session_keys: dict[KeyHash, float] = {}  # hash -> expiry on ``clock``

    def allows(self, key: str) -> bool:
        """True if ``key`` is a stored key not revoked (as last loaded) or a live session key."""
        digest = hash_key(key)
        if self._hashes is not None and digest in self._hashes:
            self._used.add(digest)
            return True
        expiry = self._session_keys.get(digest)
        return expiry is not None and expiry > self._clock()

    def tenant_of(self, key: str) -> KeyTenant | None:
        """The tenant (name, limits) of a stored key, as last loaded; None for others."""
        return None if self._hashes is None else self._hashes.get(hash_key(key))

    def refresh(self) -> None:
        """Reloads the valid hashes and records which keys were used (blocking: a thread)."""
        used, self._used = self._used, set()
        self._keys.mark_used(used, datetime.now(UTC))
        self._hashes = self._keys.active_tenants()
        self._next_refresh = self._clock() + self._refresh_s

    async def ensure_fresh(self) -> None:
        """Loads the keys on first use; later starts a background reload when stale."""
        if self._hashes is None:
            await asyncio.to_thread(self.refresh)
        elif self._clock() >= self._next_refresh and self._refreshing is None:
            self._refreshing = asyncio.create_task(asyncio.to_thread(self.refresh))
            self._refreshing.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Task[None]) -> None:
        self._refreshing = None
        if not task.cancelled() and task.exception() is not None:
            # Keep the keys we have (the database may be back soon), try again later.
            self._next_refresh = self._clock() + self._refresh_s
            log.warning("reloading the API keys failed: %s", task.exception())

    def mint_session_key(self, ttl_s: float = SESSION_KEY_TTL_S) -> str:
        """A key valid for ``ttl_s`` seconds, kept in memory only (the admin chat page's)."""
        now = self._clock()
        self._session_keys = {h: t for h, t in self._session_keys.items() if t > now}
        if len(self._session_keys) >= MAX_SESSION_KEYS:  # the oldest goes first
            self._session_keys.pop(min(self._session_keys, key=self._session_keys.__getitem__))
        key = "dsk_session_" + secrets.token_urlsafe(32)
        self._session_keys[hash_key(key)] = now + ttl_s
        return key


class RequireApiKey:
    """ASGI middleware: ``/v1`` and below need a key that ``guard`` allows.

    With ``metrics``, each request let in counts against its key's public prefix (the
    one ``dynask keys list`` shows; ``dsk_session_`` for the admin chat's keys)."""

    def __init__(
        self, app: ASGIApp, guard: ApiKeyGuard, metrics: ServingMetrics | None = None
    ) -> None:
        self.app = app
        self.guard = guard
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not (path.startswith("/v1/") or path == "/v1"):
            await self.app(scope, receive, send)
            return
        try:
            await self.guard.ensure_fresh()
        except SQLAlchemyError as exc:  # the first load only; later ones keep the old keys
            error = APIError(
                f"API keys could not be loaded from the database: {exc}; try again shortly",
                status=503,
                code="api_keys_unavailable",
            )
            await JSONResponse(error.body(), status_code=503)(scope, receive, send)
            return
        key = bearer_key(scope["headers"]) or header_key(scope["headers"], b"x-api-key")
        if key is not None and self.guard.allows(key):
            if self.metrics is not None:
                self.metrics.api_key_requests.labels(key[:PREFIX_LENGTH]).inc()
            scope.setdefault("state", {})["tenant"] = self.guard.tenant_of(key)
            await self.app(scope, receive, send)
            return
        message = MISSING_KEY_MESSAGE if key is None else INVALID_KEY_MESSAGE
        error = APIError(
            message, status=401, code="invalid_api_key", error_type="invalid_request_error"
        )
        body = error.body()
        if path.startswith("/v1/messages"):  # Anthropic's clients read Anthropic's shape
            body = {"type": "error", "error": {"type": "authentication_error", "message": message}}
        headers = {"www-authenticate": "Bearer"}
        await JSONResponse(body, status_code=401, headers=headers)(scope, receive, send)


def header_key(headers: list[tuple[bytes, bytes]], header: bytes) -> str | None:
    """The key sent as the whole value of ``header`` (Anthropic's ``x-api-key``), or None."""
    for name, value in headers:
        if name == header:
            return value.decode("latin-1").strip() or None
    return None


def bearer_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, or None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            key = key.strip()
            return key if scheme.lower() == "bearer" and key else None
    return None
