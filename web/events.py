"""Names shared by the routes, the templates and our JavaScript: SSE events and htmx
triggers. Templates read them as ``events.X``; a rename here renames them everywhere."""

from __future__ import annotations

# Server-sent events of the overview feed; each carries one rendered partial.
SSE_SUMMARY = "summary"
SSE_WORKERS = "workers"
SSE_ACTORS = "actors"
# The metrics feed's event; its data is one JSON chart point.
SSE_METRICS = "metrics"

# htmx polling triggers of the tables that are not pushed over SSE.
POLL_DEPLOYMENTS = "every 2s [!this.contains(document.activeElement)]"
POLL_EVENTS = "every 5s"
POLL_ROUTING = "every 3s"
POLL_REMOTE_WORKERS = "every 1s"


def as_dict() -> dict[str, str]:
    """Every name above, for the templates."""
    return {name: value for name, value in globals().items() if name.isupper()}
