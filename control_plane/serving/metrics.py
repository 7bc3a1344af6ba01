"""Prometheus metrics of the control plane, in a registry of its own (no globals).

Design decisions:

- Names follow the Prometheus conventions: the unit in the name (``_seconds``,
  ``_blocks``, ``_tokens``), ``_ratio`` for fractions in [0, 1], and counters exposed as
  ``_total`` (``prometheus_client`` appends it). ``deploy/observability/`` (dashboard,
  recording and alert rules) queries these names; a test runs every query of it against
  a real Prometheus scraping ``dynask run``.
- Latency buckets fit LLM serving: TTFT spans a cached short prompt (milliseconds) to a
  long prompt queued behind others (minutes); ITL is a decode step (milliseconds) up to a
  stall of seconds.
- Label values known in advance (admission limits, loss reasons, refusal reasons, routing
  modes, a model's counters once it is served) start at 0, so a rate or an alert on them
  has a series before the first event instead of "no data".
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from dynask.actors.api.stats import EngineStats
from dynask.control_plane.serving.latency_window import LatencyWindow

_TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5,
)  # fmt: skip
_DECISION_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)
_PEER_LAG_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.25, 1.0)
_BLOCK_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

# Label values known in advance (their counters start at 0).
ADMISSION_LIMITS = ("in_flight", "queue_full", "queue_wait", "prefill_tokens")
LOSS_REASONS = ("stream_closed", "heartbeat", "engine_stalled", "scheduler")
MIGRATION_REFUSALS = ("limit", "sampled", "no_engine")
# DisaggOrchestrator.counters keys: where a request's prefill ran and why.
DISAGG_OUTCOMES = (
    "remote_prefills",
    "remote_prefill_failed",
    "local_short_or_cached",
    "local_prefill_busy",
    "local_handover_failed",
    "local_decided_by_decode",
    "local_on_prefill_actor",
)


class _DisaggCollector(Collector):
    """``dynask_disagg_prefills_total{outcome}`` and the KV blocks moved, read from the
    orchestrator's own tallies at scrape time (nothing added to the request path)."""

    def __init__(self) -> None:
        self.counters: Tally[str] = Tally()

    def collect(self) -> Iterator[Metric]:
        prefills = CounterMetricFamily(
            "dynask_disagg_prefills",
            "Prefill decisions of disaggregated serving, by outcome (remote or local, why)",
            labels=["outcome"],
        )
        for outcome in DISAGG_OUTCOMES:
            prefills.add_metric([outcome], self.counters.get(outcome, 0))
        yield prefills
        yield CounterMetricFamily(
            "dynask_disagg_kv_transferred_blocks",
            "KV blocks moved from prefill to decode actors",
            value=self.counters.get("blocks_moved", 0),
        )


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
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "dynask_inter_token_latency_seconds",
            "Time between streamed deltas",
            ["model"],
            buckets=_ITL_BUCKETS,
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
            "dynask_actor_kv_usage_ratio", "KV blocks in use (fraction)", ["actor"], registry=r
        )
        self.actor_prefix_hit_rate = Gauge(
            "dynask_actor_prefix_cache_hit_ratio",
            "Prompt tokens served from the prefix cache",
            ["actor"],
            registry=r,
        )

        self._add_routing_metrics()
        self._add_kv_tier_metrics()
        self._add_reliability_metrics()
        self.api_key_requests = Counter(
            "dynask_api_key_requests",
            "Requests to /v1 let in by an API key, by the key's public prefix",
            ["key"],
            registry=r,
        )
        self._disagg = _DisaggCollector()
        r.register(self._disagg)
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
        self.routing_peer_lag_seconds = Histogram(
            "dynask_routing_peer_lag_seconds",
            "From another control plane's routing decision to its note reaching this one "
            "(router replicas: the window in which they do not see each other)",
            ["model"],
            buckets=_PEER_LAG_BUCKETS,
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
            "dynask_kv_cache_hit_ratio",
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
            "dynask_actor_kv_tier_hit_ratio",
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
            "Requests answered 503 at an admission limit (in_flight, queue_full, queue_wait, "
            "prefill_tokens)",
            ["limit"],
            registry=r,
        )
        self.tenant_requests = Counter(
            "dynask_tenant_requests",
            "Requests by tenant (API key or user) and outcome: admitted, or a limit's name "
            "(answered 429)",
            ["tenant", "outcome"],
            registry=r,
        )
        self.tenant_in_flight = Gauge(
            "dynask_tenant_in_flight", "Requests in flight by tenant", ["tenant"], registry=r
        )
        self.tenant_tokens = Counter(
            "dynask_tenant_admitted_tokens",
            "Prompt + max_tokens of the requests admitted, by tenant",
            ["tenant"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "dynask_admission_wait_seconds",
            "Time requests waited for a slot at --max-in-flight, by tenant and priority class",
            ["tenant", "priority"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.admission_waiting = Gauge(
            "dynask_admission_waiting",
            "Requests waiting for a slot at --max-in-flight, by priority class",
            ["priority"],
            registry=r,
        )
        for limit in ADMISSION_LIMITS:
            self.admission_refused.labels(limit)
        for reason in LOSS_REASONS:
            self.actors_lost.labels(reason)

    def init_model(self, model: str, routing_modes: Iterable[str]) -> None:
        """Starts a served model's counters at 0 (see the module docstring)."""
        for counter in (self.input_tokens, self.output_tokens, self.cached_prompt_tokens):
            counter.labels(model)
        self.requests_shed.labels(model)
        self.migrations.labels(model)
        for reason in MIGRATION_REFUSALS:
            self.migrations_refused.labels(model, reason)
        for mode in routing_modes:
            self.routing_decisions.labels(model, mode)

    def watch_disagg(self, counters: Tally[str]) -> None:
        """Exposes the disaggregation orchestrator's counters (read at each scrape)."""
        self._disagg.counters = counters

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
