"""The admin UI in a real browser (Debian's Chromium, driven by Playwright) against a
real ``dynask run`` (echo engine, one worker). Screenshots of every page are saved in
each test's tmp folder (``pytest --basetemp=DIR`` keeps them somewhere known)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.control_plane import server_process as sp
from tests.system_tools import require

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "browser-test-password"
TIMEOUT_MS = 60_000
UPSTREAM_KEY = "DYNASK_TEST_UPSTREAM_KEY"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("admin-server")


@pytest.fixture(scope="module")
def api_key(folder: Path) -> str:
    """A key made with the CLI before the server starts (it requires one on /v1)."""
    done = subprocess.run(
        [str(sp.BIN / "dynask"), "keys", "create", "browser-test", "--database-url", _db(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def _db(folder: Path) -> str:
    return f"sqlite:///{folder / 'state.db'}"


@pytest.fixture(scope="module")
def server(folder: Path, api_key: str) -> Iterator[str]:
    # Keys required: the chat page must reach /v1 with its own short-lived key.
    args = ["--out", "echo", "--model-name", "chat", "--workers", "1", "--require-api-key"]
    # UPSTREAM_KEY: the key an out=openai deployment forwarding to this server sends.
    env = {"DYNASK_ADMIN_PASSWORD": PASSWORD, UPSTREAM_KEY: api_key}
    with sp.dynask_run(folder, args, env) as (base, _):
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=require(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    """A fresh browser context, logged in through the form."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=server)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto("/admin/")
    expect(page).to_have_url(f"{server}/admin/login?next=/admin/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{server}/admin/")
    yield page
    context.close()


def _shot(page: Page, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def test_a_wrong_password_is_refused(browser: Browser, server: str, tmp_path: Path) -> None:
    context = browser.new_context(base_url=server)
    page = context.new_page()
    page.goto("/admin/login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "not-the-password")
    page.click("button[type=submit]")
    expect(page.locator(".flash.error")).to_have_text("Wrong user name or password.")
    _shot(page, tmp_path, "login-failed")
    context.close()


def test_the_overview_shows_the_worker_and_actor_live(page: Page, tmp_path: Path) -> None:
    expect(page.locator("#actors")).to_contain_text("default-0")
    expect(page.locator("#actors .badge")).to_have_text("ready")
    expect(page.locator("#workers")).to_contain_text("tcp://127.0.0.1:")
    _shot(page, tmp_path, "overview")


def test_a_new_deployment_gets_a_new_worker_and_becomes_ready(page: Page, tmp_path: Path) -> None:
    page.goto("/admin/workers")
    page.click("text=Start a local worker")
    expect(page.locator(".flash.ok")).to_contain_text("Starting a local worker")
    page.goto("/admin/deployments")
    page.fill("input[name=name]", "Mock")
    page.click("text=Create deployment")
    expect(page.locator("#error-name")).to_contain_text("'Mock' is not a valid name")
    _shot(page, tmp_path, "deployments-invalid")
    page.fill("input[name=name]", "mock")
    page.select_option("select[name=engine]", "mocker")
    page.fill("textarea[name=engine_args]", '{"speedup_ratio": 0}')
    page.click("text=Create deployment")
    expect(page.locator(".flash.ok")).to_have_text(
        "Deployment 'mock' created; its actors are starting."
    )
    row = page.locator("tr[data-deployment=mock]")
    expect(row.locator(".badge")).to_have_text("ready")  # the table refreshes by itself
    _shot(page, tmp_path, "deployments")
    page.goto("/admin/")
    expect(page.locator("#actors")).to_contain_text("mock-0")
    page.goto("/admin/workers")
    _shot(page, tmp_path, "workers")
    page.goto("/admin/events")
    expect(page.locator("tbody")).to_contain_text("deployment.created")
    _shot(page, tmp_path, "events")
    _retire_the_worker_of(page, "mock-0")
    page.goto("/admin/deployments")
    expect(row.locator(".badge")).to_have_text("waiting")  # no free worker is left
    expect(row.locator(".status-detail")).to_have_text("0/1 ready; waiting for a free worker")


def _retire_the_worker_of(page: Page, actor: str) -> None:
    page.goto("/admin/workers")
    page.once("dialog", lambda dialog: dialog.accept())  # the "Retire worker …?" question
    worker = page.locator("tbody tr", has_text=actor)
    worker.get_by_role("button", name="Retire").click()
    expect(page.locator(".flash.ok")).to_contain_text("retired")


def test_a_chat_reply_streams_in(page: Page, tmp_path: Path) -> None:
    page.goto("/admin/chat")
    page.select_option("#chat-model", "chat")
    page.fill("#chat-message", "hello from the browser")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-status")).to_contain_text("done: ")
    reply = page.locator(".bubble.assistant .text")
    expect(reply).to_contain_text("hello from the browser")  # the echo engine repeats it
    chunks = int(page.locator("#chat-status").inner_text().split("done: ")[1].split()[0])
    assert chunks > 5  # token by token, not one block
    _shot(page, tmp_path, "chat")


def test_a_request_shows_up_in_the_metrics(
    page: Page, server: str, api_key: str, tmp_path: Path
) -> None:
    page.goto("/admin/metrics")
    expect(page.locator("#metrics-status")).to_contain_text("updated")
    before = float(page.locator("#stat-requests_total").inner_text())
    body = {"model": "chat", "messages": [{"role": "user", "content": "count me"}], "stream": True}
    auth = {"authorization": f"Bearer {api_key}"}
    httpx.post(
        f"{server}/v1/chat/completions", json=body, headers=auth, timeout=30
    ).raise_for_status()
    expect(page.locator("#stat-requests_total")).to_have_text(f"{before + 1:.0f}")
    expect(page.locator("#stat-ttft")).not_to_have_text("– / –")
    page.wait_for_timeout(3000)  # a few more points on the charts for the screenshot
    _shot(page, tmp_path, "metrics")
    page.goto("/admin/routing")
    expect(page.locator("section.card")).to_contain_text("chat")
    _shot(page, tmp_path, "routing")


def test_emptying_the_prefix_caches_reports_each_engine(page: Page, tmp_path: Path) -> None:
    page.goto("/admin/routing")

    page.click("text=Empty the engines' prefix caches")

    expect(page).to_have_url(re.compile(r"/admin/routing$"))
    # The echo engine keeps no prefix cache: the page says which engine and why.
    flash = page.locator(".flash.error")
    expect(flash).to_contain_text("Emptied 0 of 1; ")
    expect(flash).to_contain_text("out=echo has no prefix cache this actor can empty")
    _shot(page, tmp_path, "routing-reset")
    page.goto("/admin/events")
    expect(page.locator("section.card").first).to_contain_text("prefix_cache.reset")


def test_an_admin_edits_a_keys_limits_and_the_server_applies_them(
    page: Page, server: str, folder: Path, api_key: str, tmp_path: Path
) -> None:
    page.goto("/admin/keys")
    row = page.locator("tr", has_text="browser-test")
    expect(row).to_contain_text("no limits, priority normal")
    row.locator("summary", has_text="Edit").click()
    row.locator("input[name=requests_per_s]").fill("0.2")
    row.locator("input[name=max_concurrent]").fill("4")
    row.locator("select[name=priority]").select_option("high")
    _shot(page, tmp_path, "keys-edit")
    row.locator("button", has_text="Save limits").click()
    expect(page.locator(".flash.ok")).to_contain_text("0.2 req/s, 4 concurrent, priority high")
    expect(page.locator("tr", has_text="browser-test")).to_contain_text(
        "0.2 req/s, 4 concurrent, priority high"
    )
    _shot(page, tmp_path, "keys-limits")
    listed = subprocess.run(
        [str(sp.BIN / "dynask"), "keys", "list", "--database-url", _db(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "0.2 req/s, 4 concurrent, priority high" in listed
    # The server reloads keys every 2 s: one request per 5 s now, so a burst gets a 429.
    body = {"model": "chat", "prompt": "hi", "max_tokens": 2}
    auth = {"authorization": f"Bearer {api_key}"}
    statuses: list[int] = []
    for _ in range(40):
        reply = httpx.post(f"{server}/v1/completions", json=body, headers=auth, timeout=30)
        statuses.append(reply.status_code)
        if reply.status_code == 429:
            assert reply.json()["error"]["code"] == "rate_limit_exceeded"
            assert float(reply.headers["retry-after"]) > 0
            break
        page.wait_for_timeout(200)
    assert statuses[-1] == 429, statuses
    subprocess.run(  # back to no limits for the other tests of this module
        [str(sp.BIN / "dynask"), "keys", "limits", _key_id(folder), "--database-url", _db(folder)],
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_an_openai_deployment_starts_against_a_real_dynask_server(
    page: Page, server: str, api_key: str, tmp_path: Path
) -> None:
    """The form's openai engine, its upstream this very ``dynask run`` (OpenAI-compatible):
    a bad URL is named beside its field; a good one makes a deployment whose actor starts
    against the server's ``chat`` model. Starting, the actor reads the server's
    ``/v1/models``, which needs the key: it sends the one in the variable the form named.
    (Requests through it are not sent: they carry vLLM's ``return_token_ids``, which
    dynask's own API refuses by name.)"""
    page.goto("/admin/workers")
    page.click("text=Start a local worker")  # the first worker holds chat's actor
    expect(page.locator(".flash.ok")).to_contain_text("Starting a local worker")
    page.goto("/admin/deployments")
    page.fill("input[name=name]", "fwd")
    page.select_option("select[name=engine]", "openai")
    page.fill("input[name=url]", "127.0.0.1:8000")
    page.click("text=Create deployment")
    expect(page.locator("#error-url")).to_have_text(
        "out=openai:URL has URL '127.0.0.1:8000'; expected http(s)://HOST[:PORT][/v1], "
        "e.g. out=openai:http://gpu-1:8000/v1"
    )
    expect(page.locator("select[name=engine]")).to_have_value("openai")  # kept
    _shot(page, tmp_path, "openai-invalid")
    page.fill("input[name=url]", f"{server}/v1")
    page.fill("input[name=api_key_env]", UPSTREAM_KEY)
    page.fill("textarea[name=engine_args]", '{"upstream_model": "chat"}')
    page.click("text=Create deployment")
    expect(page.locator(".flash.ok")).to_have_text(
        "Deployment 'fwd' created; its actors are starting."
    )
    row = page.locator("tr[data-deployment=fwd]")
    expect(row.locator(".engine-url")).to_have_text(f"{server}/v1")
    # A new worker process starts, then the actor loads its tokenizer and probes the server.
    expect(row.locator(".badge")).to_have_text("ready", timeout=2 * TIMEOUT_MS)
    _shot(page, tmp_path, "openai-ready")
    auth = {"authorization": f"Bearer {api_key}"}
    models = httpx.get(f"{server}/v1/models", headers=auth, timeout=30).json()["data"]
    assert {"chat", "fwd"} <= {m["id"] for m in models}  # mock too, after the test above
    _retire_the_worker_of(page, "fwd-0")


def _key_id(folder: Path) -> str:
    """The id of the module's one key (``dynask keys list``'s first column)."""
    listed = subprocess.run(
        [str(sp.BIN / "dynask"), "keys", "list", "--database-url", _db(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return listed.splitlines()[1].split()[0]
