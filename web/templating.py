"""Jinja2 for the admin UI: one template per page, partials as named blocks.

``render_page`` renders a whole page; ``render_block`` renders one named block of it
alone, for an htmx swap or an SSE event, from the same context (so the partial and the
page can never disagree).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from dynask.web import events

TEMPLATES = Path(__file__).parent / "templates"
BASE = "/admin"  # where the control plane mounts the admin app


def make_environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(base=BASE, events=events.as_dict())
    env.filters.update(
        bytes=format_bytes, percent=format_percent, when=format_time, compact_json=compact_json
    )
    env.globals["ui"] = env.get_template("_macros.html").module  # usable in lone blocks
    return env


def format_bytes(value: float | None) -> str:
    if not value:
        return "–"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def format_percent(value: float | None, scale: float = 100.0) -> str:
    """``0.42`` → ``42%`` (``scale=1`` for values already in percent)."""
    if value is None:
        return "–"
    return f"{value * scale:.0f}%"


def format_time(value: datetime | float | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), sort_keys=True, default=str)


class Renderer:
    """Renders pages and their blocks with the request's session data added."""

    def __init__(self, env: Environment | None = None) -> None:
        self.env = env or make_environment()

    def page(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> HTMLResponse:
        html = self.env.get_template(name).render(self._full(request, context, flashes=True))
        return HTMLResponse(html, status_code=status_code)

    def block(self, request: Request, name: str, block: str, context: dict[str, Any]) -> str:
        template = self.env.get_template(name)
        render = template.blocks[block]
        return "".join(render(template.new_context(self._full(request, context, flashes=False))))

    def block_response(
        self, request: Request, name: str, block: str, context: dict[str, Any]
    ) -> HTMLResponse:
        return HTMLResponse(self.block(request, name, block, context))

    def _full(self, request: Request, context: dict[str, Any], flashes: bool) -> dict[str, Any]:
        """``context`` and the session's user and CSRF token; a page takes the flashes."""
        session = request.scope.get("session", {})
        return {
            "request": request,
            "user": session.get("user"),
            "csrf_token": session.get("csrf", ""),
            "flashes": session.pop("flash", []) if flashes else [],
            **context,
        }
