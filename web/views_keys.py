"""The API keys page: list, create (the key shown once), revoke.

A new key is shown in the answer to the POST itself, not after a redirect: the flash
messages live in the session cookie, which is signed but readable, and a key must not be
written anywhere but the one page that shows it. Revoking redirects as the other forms
do (post/redirect/get). Both are logged in the event log by ``ApiKeys``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from dynask.control_plane.state.api_keys import CreatedKey
from dynask.control_plane.state.repository import NotFoundError
from dynask.web.auth import checked_form, current_user, flash
from dynask.web.deps import AdminDeps
from dynask.web.templating import BASE


def make_key_routes(deps: AdminDeps) -> list[Route]:
    async def page(
        request: Request, created: CreatedKey | None = None, error: str | None = None
    ) -> Response:
        context: dict[str, Any] = {
            "page": "keys",
            "keys": await asyncio.to_thread(deps.api_keys.list),
            "created": created,
            "required": deps.keys_required,
            "error": error,
        }
        return deps.renderer.page(request, "keys.html", context, 400 if error else 200)

    async def keys(request: Request) -> Response:
        return await page(request)

    async def create_key(request: Request) -> Response:
        name = str((await checked_form(request)).get("name") or "")
        try:
            made = await asyncio.to_thread(deps.api_keys.create, name, current_user(request))
        except ValueError as exc:
            return await page(request, error=f"The key was not created: {exc}")
        return await page(request, created=made)

    async def revoke_key(request: Request) -> Response:
        await checked_form(request)
        key_id = str(request.path_params["key_id"])
        try:
            revoked = await asyncio.to_thread(deps.api_keys.revoke, key_id, current_user(request))
        except (NotFoundError, ValueError) as exc:
            flash(request, "error", str(exc))
        else:
            flash(request, "ok", f"API key {revoked.prefix}… ({revoked.name}) revoked.")
        return RedirectResponse(f"{BASE}/keys", status_code=303)

    return [
        Route("/keys", keys, methods=["GET"], name="keys"),
        Route("/keys", create_key, methods=["POST"], name="create_key"),
        Route("/keys/{key_id:int}/revoke", revoke_key, methods=["POST"]),
    ]
