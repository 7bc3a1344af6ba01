"""Templates: each opens with its context; the overview's blocks render alone for SSE."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from starlette.requests import Request

from dynask.control_plane.cluster.cluster_admin import WorkerView
from dynask.web import events
from dynask.web.feeds import OVERVIEW_BLOCKS, overview_events
from dynask.web.templating import TEMPLATES, Renderer, format_bytes, format_percent
from tests.web.admin_stack import AdminStack

PAGES = sorted(p.name for p in TEMPLATES.glob("*.html"))


@pytest.mark.parametrize("name", PAGES)
def test_every_template_opens_with_a_comment_listing_its_context(name: str) -> None:
    text = (TEMPLATES / name).read_text()
    assert text.startswith("{#- " + name)
    if not name.startswith("_"):
        assert "context:" in text.split("#}")[0]


def test_the_sse_event_names_are_the_constants() -> None:
    overview = (TEMPLATES / "overview.html").read_text()
    for constant in ("SSE_SUMMARY", "SSE_WORKERS", "SSE_ACTORS"):
        assert f'sse-swap="{{{{ events.{constant} }}}}"' in overview
    assert set(OVERVIEW_BLOCKS) == {events.SSE_SUMMARY, events.SSE_WORKERS, events.SSE_ACTORS}


def test_the_vendored_assets_carry_their_licences() -> None:
    vendor = TEMPLATES.parent / "static" / "vendor"
    for package in ("htmx", "htmx-ext-sse", "uplot"):
        assert (vendor / package / "LICENSE").is_file()


def test_the_overview_feed_sends_each_table_once_until_it_changes(stack: AdminStack) -> None:
    request = Request({"type": "http", "session": {}, "headers": []})

    async def first_ticks() -> list[tuple[str | None, str]]:
        feed = overview_events(stack.deps, request, interval_s=0.01)
        sent = [await anext(feed) for _ in range(3)]
        pending = asyncio.ensure_future(anext(feed))
        await asyncio.sleep(0.1)
        assert not pending.done()
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        return [(event.event, str(event.data)) for event in sent]

    sent = asyncio.run(first_ticks())
    assert [name for name, _ in sent] == ["summary", "workers", "actors"]
    assert "starting…" in sent[0][1]
    assert 'id="control-plane-role">leader</div>' in sent[0][1]  # an embedded cluster's
    assert "No workers yet" in sent[1][1]
    assert "No engine actors yet" in sent[2][1]


@pytest.mark.parametrize(
    ("value", "text"), [(None, "–"), (0, "–"), (512, "512 B"), (3 * 2**30, "3.0 GiB")]
)
def test_format_bytes(value: float | None, text: str) -> None:
    assert format_bytes(value) == text


def test_format_percent() -> None:
    assert (format_percent(0.421), format_percent(None), format_percent(37, 1)) == (
        "42%",
        "–",
        "37%",
    )


def test_no_template_loads_anything_from_a_cdn() -> None:
    for path in Path(TEMPLATES).glob("*.html"):
        assert "https://" not in path.read_text(), path.name


def test_a_worker_row_shows_its_gpus() -> None:
    gpu = {"index": 0, "name": "NVIDIA H200", "memory_total": 80 * 2**30,
           "memory_used": 2**30, "utilization": 37}  # fmt: skip
    worker = WorkerView(
        address="tcp://10.0.0.5:40000",
        name="gpu-0",
        nthreads=1,
        memory_limit=64 * 2**30,
        memory_used=16 * 2**30,
        cpu_percent=12.0,
        resources={"GPU": 1.0},
        gpus=[gpu],
        actors=["llama-0"],
    )
    renderer = Renderer()
    request = Request({"type": "http", "session": {}, "headers": []})
    html = renderer.block(request, "overview.html", "workers_table", {"workers": [worker]})
    text = " ".join(html.split())
    assert "<strong>GPU 0</strong> NVIDIA H200" in text
    assert "1.0 GiB / 80.0 GiB" in text
    assert "37% util" in text
    assert "16.0 GiB / 64.0 GiB" in text
    assert '<span class="chip">llama-0</span>' in text
