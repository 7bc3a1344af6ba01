"""Prometheus metrics of the control plane, in a registry of its own (no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dynask.actors.api.stats import EngineStats
from dynask.control_plane.serving.latency_window import LatencyWindow

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DECISION_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)
_BLOCK_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServingMetrics:
    """Request counts, latencies, token counts and per-actor load."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dynask_requests",
            "Requests by model, endpoint and status",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.in_flight = Gauge("dynask_requests_in_flight", "Requests being served", registry=r)
        self.ttft = Histogram(
            "dynask_time_to_first_token_seconds",
            "Time to first token",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "dynask_inter_token_latency_seconds",
            "Time between streamed deltas",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter("dynask_input_tokens", "Prompt tokens", ["model"], registry=r)
        self.output_tokens = Counter(
            "dynask_output_tokens", "Generated tokens", ["model"], registry=r
        )
        self.actor_running = Gauge(
            "dynask_actor_requests_running", "Running requests", ["actor"], registry=r
        )
        self.actor_waiting = Gauge(
            "dynask_actor_requests_waiting", "Waiting requests", ["actor"], registry=r
        )
        self.actor_kv_usage = Gauge(
            "dynask_actor_kv_usage", "KV blocks in use (fraction)", ["actor"], registry=r
        )
        self.actor_prefix_hit_rate = Gauge(
            "dynask_actor_prefix_hit_rate",
            "Prompt tokens served from the prefix cache",
            ["actor"],
            registry=r,
        )

        self._add_routing_metrics()
        self._add_kv_tier_metrics()
        self._add_reliability_metrics()
        self._prompt_tokens_seen: dict[str, list[int]] = {}  # model -> [prompt, cached]
        self.latency_window = LatencyWindow()  # recent requests, read by the planner

    def _add_routing_metrics(self) -> None:
        r = self.registry
        self.routing_seconds = Histogram(
            "dynask_routing_decision_seconds",
            "Router's own time per decision (index lookup and scoring)",
            ["model"],
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        self.routing_overlap_blocks = Histogram(
            "dynask_routing_overlap_blocks",
            "Prompt blocks the chosen actor already held, per decision",
            ["actor"],
            buckets=_BLOCK_BUCKETS,
            registry=r,
        )
        self.routing_decisions = Counter(
            "dynask_routing_decisions",
            "Routing decisions by model and mode",
            ["model", "mode"],
            registry=r,
        )
        self.requests_shed = Counter(
            "dynask_requests_shed",
            "Requests answered 503 because every actor was at an overload threshold",
            ["model"],
            registry=r,
        )
        self.kv_resyncs = Counter(
            "dynask_kv_resyncs",
            "Prefix-index rebuilds of an actor from a KV cache dump, by reason",
            ["actor", "reason"],
            registry=r,
        )
        self.cached_prompt_tokens = Counter(
            "dynask_cached_prompt_tokens",
            "Prompt tokens of finished requests served from a prefix cache",
            ["model"],
            registry=r,
        )
        self.kv_hit_rate = Gauge(
            "dynask_kv_hit_rate",
            "Cached prompt tokens / prompt tokens, over the finished requests",
            ["model"],
            registry=r,
        )

    def _add_kv_tier_metrics(self) -> None:
        r = self.registry
        self.actor_kv_tier_blocks = Gauge(
            "dynask_actor_kv_tier_blocks",
            "KV blocks held in an offload tier (host, disk)",
            ["actor", "tier"],
            registry=r,
        )
        self.actor_kv_tier_capacity = Gauge(
            "dynask_actor_kv_tier_capacity_blocks",
            "KV blocks an offload tier can hold",
            ["actor", "tier"],
            registry=r,
        )
        self.actor_kv_tier_hit_rate = Gauge(
            "dynask_actor_kv_tier_hit_rate",
            "Prompt tokens loaded from a tier / prompt tokens looked up",
            ["actor", "tier"],
            registry=r,
        )

    def _add_reliability_metrics(self) -> None:
        r = self.registry
        self.migrations = Counter(
            "dynask_migrations",
            "Requests moved to another engine actor after theirs was lost",
            ["model"],
            registry=r,
        )
        self.migrations_refused = Counter(
            "dynask_migrations_refused",
            "Requests whose actor was lost and that could not move (limit, sampled, no_engine)",
            ["model", "reason"],
            registry=r,
        )
        self.actors_lost = Counter(
            "dynask_actors_lost",
            "Engine actors declared lost, by how it was noticed",
            ["reason"],
            registry=r,
        )
        self.admission_refused = Counter(
            "dynask_admission_refused",
            "Requests answered 503 at an admission limit (in_flight, prefill_tokens)",
            ["limit"],
            registry=r,
        )

    def observe_usage(self, model: str, prompt_tokens: int, cached_tokens: int) -> None:
        """A finished request's usage: feeds the KV hit rate."""
        seen = self._prompt_tokens_seen.setdefault(model, [0, 0])
        seen[0] += prompt_tokens
        seen[1] += cached_tokens
        self.cached_prompt_tokens.labels(model).inc(cached_tokens)
        if seen[0]:
            self.kv_hit_rate.labels(model).set(seen[1] / seen[0])

    def observe_actor(self, actor: str, stats: EngineStats) -> None:
        self.actor_running.labels(actor).set(stats.num_running)
        self.actor_waiting.labels(actor).set(stats.num_waiting)
        self.actor_kv_usage.labels(actor).set(stats.kv_usage)
        self.actor_prefix_hit_rate.labels(actor).set(stats.prefix_hit_rate)
        self.actor_kv_tier_hit_rate.labels(actor, "device").set(stats.device_hit_rate)
        for tier in ("host", "disk"):
            blocks, capacity, hit_rate = stats.tier(tier)
            if capacity:  # only engines with that tier
                self.actor_kv_tier_capacity.labels(actor, tier).set(capacity)
                self.actor_kv_tier_blocks.labels(actor, tier).set(blocks)
                self.actor_kv_tier_hit_rate.labels(actor, tier).set(hit_rate)

    def render(self) -> bytes:
        return generate_latest(self.registry)
