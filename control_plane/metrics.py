"""Prometheus metrics of the control plane, in a registry of its own (no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


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

    def observe_actor(self, actor: str, stats: dict[str, float]) -> None:
        self.actor_running.labels(actor).set(stats.get("num_running", 0))
        self.actor_waiting.labels(actor).set(stats.get("num_waiting", 0))
        self.actor_kv_usage.labels(actor).set(stats.get("kv_usage", 0.0))
        self.actor_prefix_hit_rate.labels(actor).set(stats.get("prefix_hit_rate", 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
