"""The admin chat page shows a reply's reasoning and tool calls apart from its text, in a
real browser against a real ``dynask run`` of the scripted agent engine
(``tests/control_plane/api/agents/scripted_agent.py``; see its docstring)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.control_plane import server_process as sp
from tests.control_plane.api.agents.conftest import SCRIPT
from tests.system_tools import require

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "agent-chat-password"
TIMEOUT_MS = 60_000
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    chromium = require(CHROMIUM)  # fails naming the package: this test never skips
    folder = tmp_path_factory.mktemp("agent-chat")
    args = [f"out=python:{SCRIPT}", str(tiny_llama_folder), "--model-name", "agent"]
    args += ["--reasoning-parser", "deepseek_r1"]
    env = {"DYNASK_ADMIN_PASSWORD": PASSWORD}
    expect.set_options(timeout=TIMEOUT_MS)
    with sp.dynask_run(folder, args, env) as (base, _), sync_playwright() as playwright:
        sp.wait_for_engines(base, 1)
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox"]
        )
        page = browser.new_context(base_url=base).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto("/admin/login")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(f"{base}/admin/")
        yield page
        browser.close()


def test_reasoning_and_tool_calls_are_shown_apart(page: Page, tmp_path: Path) -> None:
    page.goto("/admin/chat")
    page.select_option("#chat-model", "agent")
    page.fill("#chat-message", "think about it")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-status")).to_contain_text("done: ")
    reply = page.locator(".bubble.assistant").last
    expect(reply.locator(".text")).to_have_text("Paris.")
    expect(reply.locator(".reasoning")).to_be_visible()
    expect(reply.locator(".reasoning-text")).to_have_text("I should answer.")

    page.fill("#chat-tools", json.dumps(TOOLS))
    page.fill("#chat-message", "weather in Paris?")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-status")).to_contain_text("done: ")
    reply = page.locator(".bubble.assistant").last
    expect(reply.locator(".tool-call")).to_have_text('tool call: get_weather({"city": "Paris"})')
    expect(reply.locator(".text")).to_have_text("")  # no markup as text
    page.screenshot(path=str(tmp_path / "agent-chat.png"), full_page=True)
