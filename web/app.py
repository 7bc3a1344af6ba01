"""The admin app: pages, actions and feeds behind a login, mounted at ``/admin``."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from dynask.web.auth import SESSION_COOKIE, SESSION_MAX_AGE_S, RequireLogin
from dynask.web.deps import AdminDeps
from dynask.web.feeds import FEED_INTERVAL_S, make_feed_routes
from dynask.web.templating import BASE, TEMPLATES
from dynask.web.views_actions import make_action_routes
from dynask.web.views_auth import make_auth_routes
from dynask.web.views_keys import make_key_routes
from dynask.web.views_pages import make_page_routes
from dynask.web.views_remote import make_remote_routes

STATIC = TEMPLATES.parent / "static"


def make_admin_app(
    deps: AdminDeps, session_secret: str, feed_interval_s: float = FEED_INTERVAL_S
) -> Starlette:
    """The admin UI as an ASGI app; every route but the login and the static files
    needs a logged-in session."""
    routes: list[BaseRoute] = [
        *make_auth_routes(deps),
        *make_page_routes(deps),
        *make_action_routes(deps),
        *make_key_routes(deps),
        *make_feed_routes(deps, feed_interval_s),
        *(make_remote_routes(deps, deps.remote_workers) if deps.remote_workers else []),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if "text/html" in request.headers.get("accept", ""):
            context = {"status": exc.status_code, "message": exc.detail}
            return deps.renderer.page(request, "error.html", context, exc.status_code)
        body = {"error": {"message": exc.detail, "code": f"http_{exc.status_code}"}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    return Starlette(
        routes=routes,
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=session_secret,
                session_cookie=SESSION_COOKIE,
                max_age=SESSION_MAX_AGE_S,
                path=BASE,
                same_site="lax",
            ),
            Middleware(RequireLogin),
        ],
        exception_handlers={HTTPException: http_error},
    )
