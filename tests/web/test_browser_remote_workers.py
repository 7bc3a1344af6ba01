"""Workers on other hosts, from the admin UI in a real browser (Chromium via Playwright),
over a real ``sshd``: a worker joins a real ``dynask run`` and an engine actor is placed on
it; an unknown host key and an unreachable port are shown with their SSH errors."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.control_plane import server_process as sp
from tests.control_plane.cluster.sshd_server import SSHServer, running_sshd
from tests.system_tools import require

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "remote-workers-password"
TIMEOUT_MS = 90_000
WORKER = "remote-1-127-0-0-1-cpu"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sshd: SSHServer) -> Iterator[str]:
    """``dynask run`` with one local worker (the echo engine on it) and the test's SSH
    setup: its known_hosts (trusting ``[127.0.0.1]:PORT`` only) and its client key."""
    folder = tmp_path_factory.mktemp("remote-admin")
    env = {
        "DYNASK_ADMIN_PASSWORD": PASSWORD,
        "DYNASK_SSH_KNOWN_HOSTS": str(sshd.known_hosts),
        "DYNASK_SSH_KEY": str(sshd.client_key),
    }
    with sp.dynask_run(folder, ["--out", "echo", "--workers", "1"], env) as (base, _):
        yield base


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Page]:
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser: Browser = playwright.chromium.launch(
            executable_path=require(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=server)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto("/admin/login")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(f"{server}/admin/")
        yield page
        browser.close()


def _add(page: Page, sshd: SSHServer, host: str, port: int, gpus: int = 0) -> None:
    page.goto("/admin/workers")
    page.click("text=Add a worker on another host")
    page.fill("input[name=host]", host)
    page.fill("input[name=port]", str(port))
    page.fill("input[name=user]", sshd.user)
    page.fill("input[name=gpus]", str(gpus))
    page.fill("input[name=environment]", sys.executable)
    page.click("text=Start the workers")


def _shot(page: Page, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def test_a_bad_field_is_named_next_to_it(page: Page, sshd: SSHServer, tmp_path: Path) -> None:
    _add(page, sshd, "bad host", sshd.port)
    expect(page.locator("#error-host")).to_have_text(
        "Remote worker 'host' has value 'bad host'; expected a host name or an IP address"
    )
    expect(page.locator("input[name=user]")).to_have_value(sshd.user)  # the values are kept
    _shot(page, tmp_path, "remote-invalid")


def test_a_remote_worker_joins_and_gets_an_engine_actor(
    page: Page, sshd: SSHServer, tmp_path: Path
) -> None:
    _add(page, sshd, "127.0.0.1", sshd.port)
    expect(page.locator(".flash.ok")).to_have_text(f"Starting {WORKER} on 127.0.0.1 over SSH.")
    row = page.locator(f"tr[data-remote-worker={WORKER}]")
    expect(row.locator(".badge")).to_have_text("joined")  # the table refreshes by itself
    expect(row.locator(".remote-detail")).to_contain_text("joined as tcp://127.0.0.1:")
    _shot(page, tmp_path, "remote-joined")
    page.goto("/admin/deployments")  # the local worker holds default-0: mock goes remote
    page.fill("input[name=name]", "mock")
    page.select_option("select[name=engine]", "mocker")
    page.fill("textarea[name=engine_args]", '{"speedup_ratio": 0}')
    page.click("text=Create deployment")
    expect(page.locator("tr[data-deployment=mock] .badge")).to_have_text("ready")
    page.goto("/admin/workers")
    expect(page.locator("tbody tr", has_text=WORKER)).to_contain_text("mock-0")
    _shot(page, tmp_path, "workers-with-remote")
    page.goto("/admin/workers/remote")
    page.once("dialog", lambda dialog: dialog.accept())  # "Retire …?"
    row.get_by_role("button", name="Retire").click()
    expect(page.locator(".flash.ok")).to_have_text(f"Remote worker {WORKER} retired.")
    expect(row).to_have_count(0)  # retiring removes it (from the database too)
    page.goto("/admin/deployments")
    expect(page.locator("tr[data-deployment=mock] .badge")).to_have_text("waiting")
    page.goto("/admin/events")
    for kind in ("worker.remote.starting", "worker.remote.joined", "worker.remote.retired"):
        expect(page.locator("tbody")).to_contain_text(kind)


def test_an_unknown_host_key_is_refused_with_the_ssh_error(
    page: Page, sshd: SSHServer, tmp_path: Path
) -> None:
    # Another sshd, with a host key of its own: the server's known_hosts does not name it.
    with running_sshd(tmp_path / "other-sshd") as other:
        _add(page, sshd, "127.0.0.1", other.port)
        row = page.locator("tr[data-remote-worker=remote-2-127-0-0-1-cpu]")
        expect(row.locator(".badge")).to_have_text("failed")
    expect(row.locator(".remote-detail")).to_contain_text(
        "host key refused: Host key is not trusted for host 127.0.0.1 (checked against "
        f"{sshd.known_hosts})"
    )
    _shot(page, tmp_path, "remote-host-key")
    row.get_by_role("button", name="Remove").click()  # a failed worker is only removed
    expect(page.locator(".flash.ok")).to_have_text("Remote worker remote-2-127-0-0-1-cpu removed.")
    expect(row).to_have_count(0)


def test_an_unreachable_host_is_shown(page: Page, sshd: SSHServer, tmp_path: Path) -> None:
    port = sp.free_port()
    _add(page, sshd, "127.0.0.1", port, gpus=2)
    for gpu in (0, 1):
        row = page.locator(f"tr[data-remote-worker=remote-3-127-0-0-1-gpu{gpu}]")
        expect(row.locator(".badge")).to_have_text("failed")
        expect(row.locator(".remote-detail")).to_contain_text(
            f"host unreachable: {sshd.user}@127.0.0.1:{port}"
        )
    _shot(page, tmp_path, "remote-unreachable")
