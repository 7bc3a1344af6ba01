"""A control plane serving an engine actor of a newer version (a rolling upgrade that
started with the workers): the actor's info and stats carry fields this control plane
does not know. It serves the actor and keeps it alive; before, the info was refused at
start and every heartbeat's stats failed to decode, so the actor was declared lost after
the heartbeat timeout. Real in-process Dask cluster, mocker actors, the openai client."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from distributed import default_client

from dynask.actors.runtime.engine_actor import EngineActor
from dynask.control_plane.reliability.actor_health import ActorHealth
from dynask.control_plane.reliability.options import ReliabilityOptions
from tests.control_plane.routing_stack import MODEL, cluster_with_actors, serving_stack, tokens

pytestmark = pytest.mark.slow


class NewerEngineActor(EngineActor):
    """An engine actor as a later release would be: one more field in its info and
    one more counter in its stats."""

    async def start(self) -> dict[str, Any]:
        return {**await super().start(), "kv_tier_layout": ["device", "host"]}

    async def stats(self) -> dict[str, Any]:
        return {**await super().stats(), "num_speculative_accepts": 0}


def test_a_newer_actor_is_served_and_stays_alive(
    smollm2_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A timeout a loaded machine's pings meet; the requests span more than it.
    options = ReliabilityOptions(heartbeat_interval_s=0.1, heartbeat_timeout_s=2.0)

    async def main() -> None:
        async with cluster_with_actors(smollm2_folder, 1, actor_class=NewerEngineActor) as proxies:
            client = default_client()
            async with serving_stack(proxies, reliability=options) as stack:
                health = ActorHealth(client, options, lambda: stack.handles, lambda: None)
                health.start()
                answers = []
                for seed in range(3):
                    completion = await stack.openai.completions.create(
                        model=MODEL,
                        prompt=tokens(seed=seed, blocks=2),
                        max_tokens=8,
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )
                    assert completion.usage is not None
                    answers.append(completion.usage.completion_tokens)
                    await asyncio.sleep(1.0)  # 3 s in all: longer than the timeout
                handle = stack.handle("mock-0")
                stats = await handle.refresh_stats()
                health.stop()

                assert answers == [8, 8, 8]
                assert not handle.broken, handle.lost_reason
                assert stats.generated_tokens == 24
                assert handle.info.engine == "mocker"

    with caplog.at_level(logging.WARNING, logger="dynask.actors.api.wire_fields"):
        asyncio.run(main())
    ignored = sorted(r.getMessage().rsplit(": ", 1)[1] for r in caplog.records)
    assert ignored == ["kv_tier_layout", "num_speculative_accepts"]
