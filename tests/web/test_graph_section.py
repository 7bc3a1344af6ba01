"""The deployments page shows each stored inference graph: components and links."""

from __future__ import annotations

import html
from pathlib import Path

from dynask.control_plane.graphs.runtime import load_graph_plan
from dynask.control_plane.graphs.store import store_graph
from tests.web.admin_stack import AdminStack

GRAPHS = Path(__file__).resolve().parents[2] / "deploy" / "graphs"


def test_no_graph_section_without_graphs(stack: AdminStack, csrf: str) -> None:
    page = stack.client.get("/admin/deployments").text
    assert 'id="graphs"' not in page


def test_the_graph_of_a_deployment_shows_its_components_and_links(
    stack: AdminStack, csrf: str
) -> None:
    plan = load_graph_plan(f"{GRAPHS / 'disagg.py'}:Frontend", str(GRAPHS / "disagg.yaml"))
    store_graph(stack.deps.repo.engine, plan)
    store_graph(stack.deps.repo.engine, plan)  # served again: replaced, not duplicated

    page = html.unescape(stack.client.get("/admin/deployments").text)

    assert page.count('data-graph="disagg"') == 1
    for name in ("Frontend", "DisaggProcessor", "Decode", "Prefill"):
        assert f'data-component="{name}"' in page
    assert "disagg-decode" in page and "disagg-prefill" in page
    for link in ("Frontend → DisaggProcessor", "DisaggProcessor → Decode", "Decode → Prefill"):
        assert link in page
