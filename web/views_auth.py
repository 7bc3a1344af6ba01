"""``/admin/login`` and ``/admin/logout``."""

from __future__ import annotations

import asyncio
import math

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from dynask.web.auth import USER_KEY, checked_form, csrf_token, log_in, safe_next
from dynask.web.deps import AdminDeps
from dynask.web.templating import BASE

LOGIN_FAILED = "Wrong user name or password."
LOCKED_OUT = "Too many failed logins; try again in {seconds} s."


def make_auth_routes(deps: AdminDeps) -> list[Route]:
    async def login_page(request: Request) -> Response:
        if request.session.get(USER_KEY):
            return RedirectResponse(safe_next(request.query_params.get("next")), 303)
        return _login_form(request, username="", error=None)

    def _login_form(
        request: Request, username: str, error: str | None, status: int = 200
    ) -> Response:
        context = {
            "username": username,
            "error": error,
            "next": safe_next(request.query_params.get("next")),
            "login_csrf": csrf_token(request),
        }
        return deps.renderer.page(request, "login.html", context, status)

    async def login(request: Request) -> Response:
        form = await checked_form(request)
        username = str(form.get("username") or "").strip()
        password = str(form.get("password") or "")
        client = request.client.host if request.client else "unknown"
        throttle = deps.login_throttle
        wait = throttle.retry_after(username, client)
        if wait > 0:  # refused before the password is even checked
            seconds = math.ceil(wait)
            response = _login_form(request, username, LOCKED_OUT.format(seconds=seconds), 429)
            response.headers["Retry-After"] = str(seconds)
            return response
        user = await asyncio.to_thread(deps.users.authenticate, username, password)
        if user is None:
            throttle.failed(username, client)
            return _login_form(request, username, LOGIN_FAILED, status=401)
        throttle.succeeded(username, client)
        log_in(request, user.username)
        return RedirectResponse(safe_next(str(form.get("next") or "")), 303)

    async def logout(request: Request) -> Response:
        await checked_form(request)
        request.session.clear()
        return RedirectResponse(f"{BASE}/login", 303)

    return [
        Route("/login", login_page, methods=["GET"], name="login_page"),
        Route("/login", login, methods=["POST"], name="login"),
        Route("/logout", logout, methods=["POST"], name="logout"),
    ]
