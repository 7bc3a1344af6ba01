"""A vLLM engine's load and counters as dynask's ``EngineStats``.

vLLM hands its scheduler and iteration stats to every stat logger once per engine step
(on the frontend's output loop). ``VLLMLoad`` keeps the latest scheduler numbers and
running totals; ``stat_logger_factory`` makes the logger vLLM calls. vLLM documents the
stat logger interface as not stable, so only a few plain fields are read, each with a
default.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from dynask.actors.api.stats import EngineStats


@dataclass(frozen=True, slots=True)
class _SchedulerSnapshot:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0


class VLLMLoad:
    """The latest scheduler snapshot and totals since start; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot = _SchedulerSnapshot()
        self._totals = {
            "steps": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "prefix_queried_tokens": 0,
            "prefix_hit_tokens": 0,
            "preemptions": 0,
        }

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """What vLLM reports after a step (either may be None)."""
        with self._lock:
            if scheduler_stats is not None:
                self._totals["steps"] += 1
                self._snapshot = _SchedulerSnapshot(
                    int(getattr(scheduler_stats, "num_running_reqs", 0)),
                    int(getattr(scheduler_stats, "num_waiting_reqs", 0)),
                    float(getattr(scheduler_stats, "kv_cache_usage", 0.0)),
                )
                prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
                if prefix is not None:
                    self._totals["prefix_queried_tokens"] += int(getattr(prefix, "queries", 0))
                    self._totals["prefix_hit_tokens"] += int(getattr(prefix, "hits", 0))
            if iteration_stats is not None:
                preempted = int(getattr(iteration_stats, "num_preempted_reqs", 0))
                self._totals["preemptions"] += preempted

    def note_prompt(self, num_tokens: int) -> None:
        with self._lock:
            self._totals["prompt_tokens"] += num_tokens

    def note_finished(self, num_generated: int) -> None:
        with self._lock:
            self._totals["generated_tokens"] += num_generated

    def stats(self, unfinished: int, num_kv_blocks: int, num_cached_blocks: int) -> EngineStats:
        """``EngineStats``; running + waiting never exceed the ``unfinished`` requests
        (vLLM reports its scheduler only when it steps, so an idle engine's last report
        would otherwise show the load it had before going idle)."""
        with self._lock:
            snapshot, totals = self._snapshot, dict(self._totals)
        running = min(snapshot.num_running, unfinished)
        waiting = min(snapshot.num_waiting, unfinished - running)
        kv_usage = snapshot.kv_usage if unfinished else 0.0
        used = round(kv_usage * num_kv_blocks)
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            num_kv_blocks=num_kv_blocks,
            num_free_kv_blocks=num_kv_blocks - used,
            num_cached_kv_blocks=num_cached_blocks,
            kv_usage=kv_usage,
            prefix_queried_tokens=totals["prefix_queried_tokens"],
            prefix_hit_tokens=totals["prefix_hit_tokens"],
            num_preemptions=totals["preemptions"],
            num_steps=totals["steps"],
            prompt_tokens=totals["prompt_tokens"],
            generated_tokens=totals["generated_tokens"],
        )


def stat_logger_factory(load: VLLMLoad) -> Any:
    """A per-engine stat logger factory for ``AsyncLLM`` that feeds ``load``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class DynaskStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            load.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return DynaskStatLogger
