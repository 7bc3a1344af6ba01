"""Login, sessions and CSRF for the admin UI.

Design decisions:
- Sessions are Starlette's signed cookie (``SessionMiddleware``, itsdangerous), scoped
  to ``/admin`` and ``SameSite=Lax``; it holds the user name, the CSRF token and flash
  messages, nothing secret. The signing key is ``DYNASK_SESSION_SECRET`` or a random one
  per process (a restart then signs everyone out).
- ``RequireLogin`` guards the whole admin app, so a new route is protected by default;
  only the login page and the static files are public. A browser asking for a page is
  sent to the login form; htmx, JSON and SSE requests get 401.
- CSRF: a random token per session, sent back by every form as ``csrf_token`` (or the
  ``X-CSRF-Token`` header) and compared in constant time. ``checked_form`` is the only
  way the POST handlers read a form, so none can skip the check.
- Logging in replaces the session (no fixation) and makes a new CSRF token.
"""

from __future__ import annotations

import hmac
import os
import secrets
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from dynask.web.templating import BASE

SESSION_SECRET_VARIABLE = "DYNASK_SESSION_SECRET"
SESSION_COOKIE = "dynask_admin"
SESSION_MAX_AGE_S = 12 * 3600
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
USER_KEY = "user"
CSRF_KEY = "csrf"
PUBLIC_PATHS = ("/login", "/static/")


def session_secret() -> str:
    return os.environ.get(SESSION_SECRET_VARIABLE) or secrets.token_urlsafe(32)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use."""
    token = request.session.get(CSRF_KEY)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session[CSRF_KEY] = token
    return token


def log_in(request: Request, username: str) -> None:
    request.session.clear()
    request.session[USER_KEY] = username
    request.session[CSRF_KEY] = secrets.token_urlsafe(32)


def current_user(request: Request) -> str:
    user = request.session.get(USER_KEY)
    if not isinstance(user, str):
        raise HTTPException(401, "login required")
    return user


def flash(request: Request, kind: str, message: str) -> None:
    """A message shown once on the next page (``kind``: ok or error)."""
    request.session.setdefault("flash", []).append({"kind": kind, "message": message})


async def checked_form(request: Request) -> FormData:
    """The request's form, after checking its CSRF token (403 when missing or wrong)."""
    form = await request.form()
    sent = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
    expected = request.session.get(CSRF_KEY)
    if not sent or not isinstance(sent, str) or not isinstance(expected, str):
        raise HTTPException(403, "CSRF token missing; reload the page and submit again")
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise HTTPException(403, "CSRF token invalid; reload the page and submit again")
    return form


def safe_next(target: str | None) -> str:
    """Where to go after logging in: only a path of the admin app (no open redirect)."""
    if target and target.startswith(BASE + "/") and not target.startswith("//"):
        return target
    return BASE + "/"


class RequireLogin:
    """ASGI middleware: everything but ``PUBLIC_PATHS`` needs a logged-in session."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _is_public(scope) or scope["session"].get(USER_KEY):
            await self.app(scope, receive, send)
            return
        response = _unauthorized(Request(scope, receive))
        await response(scope, receive, send)


def _is_public(scope: Scope) -> bool:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in PUBLIC_PATHS)


def _unauthorized(request: Request) -> Response:
    login = f"{BASE}/login"
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"HX-Redirect": login})
    wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
    if wants_page:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{login}?next={quote(target)}", status_code=303)
    body: dict[str, Any] = {"error": {"message": "login required", "code": "login_required"}}
    return JSONResponse(body, status_code=401)
