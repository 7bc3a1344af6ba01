"""The protocol every engine backend implements, so one ``EngineActor`` can drive any.

Backends: the built-in engine (``out=torch``), ``vllm``, ``echo``, ``mocker``, ``python``
and ``openai`` (forwarding to a server elsewhere). An
engine takes token ids (the control plane applies chat templates and tokenizes), runs
its own thread, and hands every step's deltas to its output listeners in one call.
Engines with a prefix cache (the built-in engine and the mocker) are also
``KVCacheEngine``s: their KV events and dumps feed the control plane's prefix index;
the others (echo, python) are routed with an approximate index instead. An engine whose
model runs on a server it does not own (``out=openai``) is a ``ForwardingEngine``: it can
lose that server while its actor lives on, and says so.

Optional attributes the ``EngineActor`` reads into the actor's info where an engine has
them: ``sampling_defaults`` (a model's generation defaults), ``kv_protected_share`` (how
its prefix cache evicts, ``kv.free_queue``; absent: plain LRU) and ``kv_cache_tokens``
(its KV cache's size when ``stats().num_kv_blocks`` cannot say, as for a forwarding
engine). Approximate routing models the cache from the last two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.stats import EngineStats
from dynask.actors.api.streams import OutputListener
from dynask.kv.events import KVEventLog
from dynask.kv.prefix_index import KVCacheDump


@runtime_checkable
class Engine(Protocol):
    """What an ``EngineActor`` needs from an engine."""

    max_model_len: int
    kv_events: KVEventLog

    def start(self) -> None:
        """Starts the engine's own thread (idempotent)."""

    def shutdown(self) -> None:
        """Stops the thread; requests in flight are dropped."""

    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str) -> object:
        """Queues a request; raises ``ValueError`` with a clear message for bad input."""

    def abort(self, request_id: str) -> None:
        """Cancels a request and frees its blocks; unknown ids are ignored."""

    def add_output_listener(self, listener: OutputListener) -> None:
        """``listener`` gets each step's deltas, on the engine thread, one call per step."""

    def stats(self) -> EngineStats:
        """Load and cache state, for routing, metrics and the admin UI."""


@runtime_checkable
class KVCacheEngine(Protocol):
    """An engine with a prefix cache that reports its changes in ``kv_events``."""

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block."""

    def kv_cache_dump(self) -> KVCacheDump:
        """The whole prefix cache as of ``kv_events.last_event_id`` (safe from any thread)."""


@runtime_checkable
class PrefixCacheResetEngine(Protocol):
    """An engine whose prefix cache can be emptied on request (``POST
    /v1/engines/reset_prefix_cache``: a benchmark's phases start cold, an operator drops
    what a changed model left behind)."""

    def reset_prefix_cache(self) -> bool:
        """Drops every cached block when no request holds one; False, changing nothing,
        otherwise. ``ValueError`` says why it cannot at all. Safe from any thread."""


PrefillListener = Callable[[dict[str, int]], None]
"""Gets ``{request id: prompt tokens still to compute}`` after a step that advanced those
prompts' prefill without finishing it."""


@runtime_checkable
class PrefillProgressEngine(Protocol):
    """An engine that says how far its long prompts' chunked prefill has got: the router
    counts an actor's queued prefill, and a prompt halfway through is half the work."""

    def add_prefill_listener(self, listener: PrefillListener) -> None:
        """``listener`` is called on the engine thread after each step that advanced a
        prompt's prefill without finishing it (the first delta says when it is over)."""


@runtime_checkable
class ForwardingEngine(Protocol):
    """An engine that forwards to a server it does not own (``out=openai``)."""

    def add_lost_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(reason)`` is called once, on the engine thread, when the server is
        gone; the engine publishes nothing more for the requests it had."""
