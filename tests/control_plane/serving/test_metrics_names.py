"""ServingMetrics: names per the Prometheus conventions, counters that start at 0, the
disaggregation tallies exposed at scrape time."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from dynask.actors.api.stats import EngineStats
from dynask.control_plane.serving.metrics import ServingMetrics


def _samples(metrics: ServingMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_served_model_and_the_known_reasons_start_at_zero() -> None:
    metrics = ServingMetrics()
    metrics.init_model("m", ["kv", "random"])
    samples = _samples(metrics)
    assert samples[("dynask_requests_shed_total", (("model", "m"),))] == 0
    assert (
        samples[("dynask_migrations_refused_total", (("model", "m"), ("reason", "sampled")))] == 0
    )
    assert samples[("dynask_routing_decisions_total", (("mode", "random"), ("model", "m")))] == 0
    assert samples[("dynask_admission_refused_total", (("limit", "in_flight"),))] == 0
    assert samples[("dynask_actors_lost_total", (("reason", "heartbeat"),))] == 0


def test_the_disaggregation_tallies_are_read_at_each_scrape() -> None:
    metrics = ServingMetrics()
    tallies: Counter[str] = Counter()
    metrics.watch_disagg(tallies)
    tallies.update({"remote_prefills": 3, "local_prefill_busy": 1, "blocks_moved": 42})
    samples = _samples(metrics)
    assert samples[("dynask_disagg_prefills_total", (("outcome", "remote_prefills"),))] == 3
    assert samples[("dynask_disagg_prefills_total", (("outcome", "local_prefill_busy"),))] == 1
    assert samples[("dynask_disagg_prefills_total", (("outcome", "remote_prefill_failed"),))] == 0
    assert samples[("dynask_disagg_kv_transferred_blocks_total", ())] == 42


def test_ratios_and_units_are_in_the_names() -> None:
    metrics = ServingMetrics()
    stats = EngineStats(
        num_running=1,
        num_waiting=0,
        num_kv_blocks=8,
        num_free_kv_blocks=4,
        num_cached_kv_blocks=0,
        kv_usage=0.5,
        prefix_queried_tokens=400,
        prefix_hit_tokens=100,
        num_preemptions=0,
        num_steps=3,
        prompt_tokens=400,
        generated_tokens=3,
    )
    metrics.observe_actor("a", stats)
    metrics.observe_usage("m", 100, 40)
    samples = _samples(metrics)
    assert samples[("dynask_actor_kv_usage_ratio", (("actor", "a"),))] == 0.5
    assert samples[("dynask_actor_prefix_cache_hit_ratio", (("actor", "a"),))] == 0.25
    assert samples[("dynask_kv_cache_hit_ratio", (("model", "m"),))] == 0.4
    assert samples[("dynask_cached_prompt_tokens_total", (("model", "m"),))] == 40
