"""The API keys page: list, create (the key shown once), revoke, and each key's tenant
limits (requests/s, concurrent requests, tokens/minute, priority class) edited in place.

A new key is shown in the answer to the POST itself, not after a redirect: the flash
messages live in the session cookie, which is signed but readable, and a key must not be
written anywhere but the one page that shows it. Revoking redirects as the other forms
do (post/redirect/get), and so does a limits edit: an empty field is no limit, a bad
value is flashed with ``TenantLimits``'s message naming the field, and nothing changes.
All are logged in the event log by ``ApiKeys``; the server applies new limits at its
next key refresh (``RequireApiKey``: within seconds).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from dynask.control_plane.state.api_keys import PRIORITIES, CreatedKey, TenantLimits
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
            "priorities": PRIORITIES,
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

    async def set_limits(request: Request) -> Response:
        form = await checked_form(request)
        key_id = str(request.path_params["key_id"])
        try:
            limits = limits_from_form({k: str(v) for k, v in form.items()})
            changed = await asyncio.to_thread(
                deps.api_keys.set_limits, key_id, limits, current_user(request)
            )
        except (NotFoundError, ValueError) as exc:
            flash(request, "error", f"The limits were not changed: {exc}")
        else:
            flash(
                request,
                "ok",
                f"API key {changed.prefix}… ({changed.name}): {changed.limits.describe()}.",
            )
        return RedirectResponse(f"{BASE}/keys", status_code=303)

    return [
        Route("/keys", keys, methods=["GET"], name="keys"),
        Route("/keys/{key_id:int}/limits", set_limits, methods=["POST"]),
        Route("/keys", create_key, methods=["POST"], name="create_key"),
        Route("/keys/{key_id:int}/revoke", revoke_key, methods=["POST"]),
    ]


def limits_from_form(form: dict[str, str]) -> TenantLimits:
    """The limits of the edit form: empty fields are no limit; ``ValueError`` names a bad
    field (``TenantLimits`` checks the ranges)."""

    def number(name: str, kind: type[int] | type[float]) -> Any:
        text = form.get(name, "").strip()
        if not text:
            return None
        try:
            return kind(text)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise ValueError(f"'{name}' has value {text!r}; expected {expected}") from None

    return TenantLimits(
        number("requests_per_s", float),
        number("max_concurrent", int),
        number("tokens_per_minute", int),
        form.get("priority", "normal").strip() or "normal",
    )
