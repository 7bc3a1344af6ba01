"""Every admin route needs a login; every form needs its CSRF token."""

from __future__ import annotations

import pytest

from tests.web.admin_stack import PASSWORD, AdminStack, csrf_of, log_in

PAGES = [
    "/admin/",
    "/admin/workers",
    "/admin/deployments",
    "/admin/metrics",
    "/admin/chat",
    "/admin/routing",
    "/admin/keys",
    "/admin/events",
]
PARTIALS = ["/admin/deployments/table", "/admin/routing/table", "/admin/events/table"]
DATA = ["/admin/api/snapshot", "/admin/feeds/overview", "/admin/feeds/metrics"]
FORMS = [
    "/admin/deployments",
    "/admin/deployments/some-name/scale",
    "/admin/deployments/some-name/delete",
    "/admin/workers/add",
    "/admin/workers/retire",
    "/admin/keys",
    "/admin/keys/1/revoke",
    "/admin/keys/1/limits",
    "/admin/logout",
]
BROWSER = {"accept": "text/html,application/xhtml+xml"}


@pytest.mark.parametrize("path", PAGES)
def test_a_page_sends_a_browser_to_the_login_form(stack: AdminStack, path: str) -> None:
    response = stack.client.get(path, headers=BROWSER)
    assert response.status_code == 303
    assert response.headers["location"] == f"/admin/login?next={path}"


@pytest.mark.parametrize("path", PAGES + PARTIALS + DATA)
def test_without_a_session_data_and_pages_answer_401(stack: AdminStack, path: str) -> None:
    response = stack.client.get(path, headers={"accept": "application/json"})
    assert response.status_code == 401
    assert response.json() == {"error": {"message": "login required", "code": "login_required"}}


@pytest.mark.parametrize("path", PARTIALS)
def test_an_htmx_request_without_a_session_is_redirected_by_htmx(
    stack: AdminStack, path: str
) -> None:
    response = stack.client.get(path, headers={"hx-request": "true"})
    assert response.status_code == 401
    assert response.headers["hx-redirect"] == "/admin/login"


@pytest.mark.parametrize("path", FORMS)
def test_a_form_without_a_session_is_refused(stack: AdminStack, path: str) -> None:
    assert stack.client.post(path, data={"csrf_token": "x"}).status_code == 401


@pytest.mark.parametrize("path", FORMS)
def test_a_form_without_its_csrf_token_is_refused(stack: AdminStack, csrf: str, path: str) -> None:
    response = stack.client.post(path, data={"name": "x", "replicas": "1"})
    assert response.status_code == 403
    assert response.json()["error"]["message"] == (
        "CSRF token missing; reload the page and submit again"
    )


@pytest.mark.parametrize("path", FORMS)
def test_a_form_with_a_wrong_csrf_token_is_refused(stack: AdminStack, csrf: str, path: str) -> None:
    response = stack.client.post(path, data={"csrf_token": csrf + "x"})
    assert response.status_code == 403
    assert "CSRF token invalid" in response.json()["error"]["message"]


def test_a_refused_form_shows_an_error_page_to_a_browser(stack: AdminStack, csrf: str) -> None:
    response = stack.client.post("/admin/workers/add", data={}, headers=BROWSER)
    assert response.status_code == 403
    assert "<h1>Error 403</h1>" in response.text


@pytest.mark.parametrize("path", PAGES + PARTIALS + ["/admin/api/snapshot"])
def test_after_login_every_page_answers(stack: AdminStack, csrf: str, path: str) -> None:
    assert stack.client.get(path).status_code == 200


def test_login_needs_the_csrf_token(stack: AdminStack) -> None:
    stack.client.get("/admin/login")
    response = stack.client.post("/admin/login", data={"username": "admin", "password": PASSWORD})
    assert response.status_code == 403


def test_a_wrong_password_shows_the_form_again(stack: AdminStack) -> None:
    token = csrf_of(stack.client.get("/admin/login").text)
    response = stack.client.post(
        "/admin/login", data={"username": "admin", "password": "wrong", "csrf_token": token}
    )
    assert response.status_code == 401
    assert "Wrong user name or password." in response.text
    assert 'name="username" value="admin"' in response.text
    assert stack.client.get("/admin/", headers=BROWSER).status_code == 303


def test_login_goes_to_next_but_never_off_site(stack: AdminStack) -> None:
    token = csrf_of(stack.client.get("/admin/login").text)
    form = {"username": "admin", "password": PASSWORD, "csrf_token": token}
    response = stack.client.post("/admin/login", data={**form, "next": "/admin/events"})
    assert response.headers["location"] == "/admin/events"
    token = csrf_of(stack.client.get("/admin/events").text)
    response = stack.client.post(
        "/admin/login", data={**form, "csrf_token": token, "next": "https://evil.example/"}
    )
    assert response.headers["location"] == "/admin/"


def test_login_replaces_the_csrf_token(stack: AdminStack) -> None:
    before = csrf_of(stack.client.get("/admin/login").text)
    after = log_in(stack.client)
    assert after != before


def test_logout_ends_the_session(stack: AdminStack, csrf: str) -> None:
    response = stack.client.post("/admin/logout", data={"csrf_token": csrf})
    assert (response.status_code, response.headers["location"]) == (303, "/admin/login")
    assert stack.client.get("/admin/", headers=BROWSER).status_code == 303


def test_the_session_cookie_is_scoped_to_the_admin_app(stack: AdminStack, csrf: str) -> None:
    cookie = next(c for c in stack.client.cookies.jar if c.name == "dynask_admin")
    assert cookie.path == "/admin"


def test_static_files_and_the_login_form_are_public(stack: AdminStack) -> None:
    assert stack.client.get("/admin/static/app.css").status_code == 200
    assert stack.client.get("/admin/static/vendor/htmx/htmx.min.js").status_code == 200
    assert stack.client.get("/admin/login").status_code == 200


def test_the_root_leads_to_the_admin_ui(stack: AdminStack) -> None:
    assert stack.client.get("/").headers["location"] == "/admin/"
    assert stack.client.get("/admin").headers["location"] == "/admin/"
