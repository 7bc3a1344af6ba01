"""The API keys page: create (the key shown once), revoke, both in the event log; and the
chat page's short-lived key."""

from __future__ import annotations

import html
import re

from tests.web.admin_stack import AdminStack

SHOWN_KEY = re.compile(r'<code class="api-key" id="created-key">(dsk_[A-Za-z0-9_-]{43})</code>')


def _create(stack: AdminStack, csrf: str, name: str) -> str:
    response = stack.client.post("/admin/keys", data={"name": name, "csrf_token": csrf})
    assert response.status_code == 200, response.text
    match = SHOWN_KEY.search(response.text)
    assert match is not None, "the new key is not on the page"
    return match.group(1)


def test_create_shows_the_key_once_and_logs_it(stack: AdminStack, csrf: str) -> None:
    key = _create(stack, csrf, "team-search")

    assert stack.deps.key_guard.allows(key) is False  # not loaded yet: the guard refreshes
    stack.deps.key_guard.refresh()
    assert stack.deps.key_guard.allows(key) is True
    page = stack.client.get("/admin/keys").text
    assert key not in page and f"<code>{key[:12]}…</code>" in page
    assert "team-search" in page
    [event] = stack.deps.repo.recent_events(1)
    assert (event.who, event.kind, event.subject) == ("admin", "api_key.created", "team-search")
    assert key not in str(stack.client.cookies)  # never in the (readable) session cookie


def test_a_nameless_key_is_refused(stack: AdminStack, csrf: str) -> None:
    response = stack.client.post("/admin/keys", data={"name": " ", "csrf_token": csrf})
    assert response.status_code == 400
    assert "The key was not created: API key &#39;name&#39; has value" in response.text
    assert stack.deps.api_keys.list() == []


def test_revoke_logs_it_and_the_key_stops_working(stack: AdminStack, csrf: str) -> None:
    key = _create(stack, csrf, "ci")
    [record] = stack.deps.api_keys.list()

    response = stack.client.post(f"/admin/keys/{record.id}/revoke", data={"csrf_token": csrf})
    assert (response.status_code, response.headers["location"]) == (303, "/admin/keys")
    page = html.unescape(stack.client.get("/admin/keys").text)
    assert f"API key {key[:12]}… (ci) revoked." in page
    stack.deps.key_guard.refresh()
    assert stack.deps.key_guard.allows(key) is False
    [event] = stack.deps.repo.recent_events(1)
    assert (event.kind, event.subject, event.details) == (
        "api_key.revoked",
        "ci",
        {"id": record.id, "prefix": key[:12]},
    )

    again = stack.client.post(f"/admin/keys/{record.id}/revoke", data={"csrf_token": csrf})
    page = html.unescape(stack.client.get(again.headers["location"]).text)
    assert f"API key {key[:12]}… ('ci') is already revoked" in page


def test_the_chat_page_carries_a_short_lived_key(stack: AdminStack, csrf: str) -> None:
    page = stack.client.get("/admin/chat").text
    match = re.search(r'data-api-key="(dsk_session_[A-Za-z0-9_-]{43})"', page)
    assert match is not None
    stack.deps.key_guard.refresh()
    assert stack.deps.key_guard.allows(match.group(1)) is True


def test_limits_are_edited_in_place_and_logged(stack: AdminStack, csrf: str) -> None:
    key = _create(stack, csrf, "batch")
    [record] = stack.deps.api_keys.list()
    form = {
        "csrf_token": csrf,
        "requests_per_s": "2.5",
        "max_concurrent": "3",
        "tokens_per_minute": "",
        "priority": "low",
    }

    response = stack.client.post(f"/admin/keys/{record.id}/limits", data=form)

    assert (response.status_code, response.headers["location"]) == (303, "/admin/keys")
    page = html.unescape(stack.client.get("/admin/keys").text)
    assert f"API key {key[:12]}… (batch): 2.5 req/s, 3 concurrent, priority low." in page
    [stored] = stack.deps.api_keys.list()
    assert (stored.limits.requests_per_s, stored.limits.max_concurrent) == (2.5, 3)
    assert (stored.limits.tokens_per_minute, stored.limits.priority) == (None, "low")
    [event] = stack.deps.repo.recent_events(1)
    assert (event.kind, event.details["limits"]) == (
        "api_key.limits",
        "2.5 req/s, 3 concurrent, priority low",
    )
    stack.deps.key_guard.refresh()
    tenant = stack.deps.key_guard.tenant_of(key)
    assert tenant is not None and tenant.limits == stored.limits  # what the server applies


def test_bad_limits_are_refused_by_name_and_change_nothing(stack: AdminStack, csrf: str) -> None:
    _create(stack, csrf, "ci")
    [record] = stack.deps.api_keys.list()
    for field, value, message in [
        ("max_concurrent", "two", "'max_concurrent' has value 'two'; expected an integer"),
        ("max_concurrent", "0", "'max_concurrent' has value 0; expected an integer >= 1"),
        ("requests_per_s", "-1", "'requests_per_s' has value -1.0; expected > 0"),
        ("priority", "urgent", "'priority' has value 'urgent'; expected one of"),
    ]:
        form = {"csrf_token": csrf, field: value}
        response = stack.client.post(f"/admin/keys/{record.id}/limits", data=form)
        assert response.status_code == 303
        page = html.unescape(stack.client.get("/admin/keys").text)
        assert "The limits were not changed: " in page and message in page, field
    [stored] = stack.deps.api_keys.list()
    assert stored.limits.describe() == "no limits, priority normal"
