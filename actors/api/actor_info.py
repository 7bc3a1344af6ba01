"""What an engine actor reports about itself: ``ActorInfo``, decoded once at the boundary.

``EngineActor.start`` answers with a plain dict (it crosses the Dask wire, and an actor
adopted from an earlier control plane answers with the one it made then). The control
plane turns it into an ``ActorInfo`` once, in ``ActorHandle``; everything after reads
attributes. A required field the answer lacks is an error naming it; a field only a
newer actor sends is logged by name and ignored, so a rolling upgrade can start with
either side (``wire_fields``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dynask.actors.api.wire_fields import WireDecoder


@dataclass(frozen=True)
class ActorInfo:
    """One engine actor's identity, limits and addresses."""

    name: str
    stream_address: str  # host:port of its token stream (``token_stream``)
    max_model_len: int
    engine: str  # the ``out=`` kind: torch, vllm, mocker, echo, python
    model: str | None  # the model argument it loaded (None: the bundled one)
    worker: str  # the Dask worker's address ("local" outside a worker)
    kv_events: bool = False  # False: no prefix cache to follow; route approximately
    kv_block_size: int | None = None  # None for engines without a KV cache
    # The engine's KV cache as approximate routing models it: its size in tokens (None:
    # unknown) and the share of it its eviction protects for reused blocks (0: plain LRU).
    kv_cache_tokens: int | None = None
    kv_protected_share: float = 0.0
    tokenizer_files: dict[str, bytes] = field(default_factory=dict, repr=False)
    kv_transfer_address: str | None = None  # set once a prefill/decode listener is open
    # SamplingParams keywords for fields a request leaves out (``sampling_defaults``).
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    # True: its ``prefill_remote`` takes ``routed`` and passes the prefill on to its other
    # readers (router replicas). An actor from before that sends no such field: False, and
    # a control plane calls it without ``routed``.
    shares_prefill_routings: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ActorInfo 'name' has value {self.name!r}; expected a non-empty str")
        if ":" not in str(self.stream_address):
            raise ValueError(
                f"ActorInfo 'stream_address' has value {self.stream_address!r}; expected host:port"
            )
        for name in ("max_model_len", "kv_block_size", "kv_cache_tokens"):
            value = getattr(self, name)
            if value is None and name != "max_model_len":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ActorInfo '{name}' has value {value!r}; expected an int >= 1")
        share = self.kv_protected_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ValueError(
                f"ActorInfo 'kv_protected_share' has value {share!r}; expected a number in [0, 1]"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActorInfo:
        """Decodes ``EngineActor.start``'s answer: a missing field is an error that names
        it, an unknown one (a newer actor's) is logged and ignored (``wire_fields``)."""
        return _DECODER.decode(data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_kv_transfer(self, address: str) -> ActorInfo:
        """This info with the address of the actor's KV transfer listener."""
        return replace(self, kv_transfer_address=address)


_DECODER = WireDecoder(ActorInfo, "engine actor info")
