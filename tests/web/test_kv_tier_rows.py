"""The overview shows each engine's KV offload tiers: usage and hit rate per tier."""

from __future__ import annotations

from dataclasses import replace

from starlette.requests import Request

from dynask.actors.api.stats import EngineStats
from dynask.web.snapshot import ActorRow, TierRow, tier_rows
from dynask.web.templating import Renderer

IDLE = EngineStats.load_only(num_running=0, steps=0, prompt_tokens=0, generated_tokens=0)
STATS = replace(  # no disk tier
    IDLE,
    prefix_queried_tokens=200,
    prefix_hit_tokens=100,
    host_kv_blocks=30,
    host_kv_capacity_blocks=120,
    host_hit_tokens=100,
)


def test_tier_rows_come_from_the_engine_stats() -> None:
    assert tier_rows(STATS) == (TierRow("host", 0.25, 0.5),)
    assert tier_rows(replace(IDLE, num_kv_blocks=8)) == ()


def test_an_actor_row_renders_its_tiers() -> None:
    row = ActorRow(
        name="llama-0",
        deployment="default",
        role="aggregated",
        model="m",
        worker="tcp://w",
        running=0,
        waiting=0,
        in_flight=0,
        kv_usage=0.1,
        prefix_hit_rate=0.6,
        health="ready",
        kv_tiers=tier_rows(STATS),
    )
    request = Request({"type": "http", "session": {}, "headers": []})
    html = Renderer().block(request, "overview.html", "actors_table", {"actors": [row]})
    text = " ".join(html.split())
    assert '<td class="kv-tiers"><div>host' in text
    assert 'title="25%"' in text  # the usage meter
    assert "50% hits" in text
