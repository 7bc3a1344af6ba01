"""Per-request sampling parameters: how to pick tokens and when to stop.

Built and validated once (in the control plane, or by a direct caller of an engine) and
handed to whichever backend serves the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynask.actors.api.structured_output import StructuredOutput


class SamplingParamError(ValueError):
    """One sampling parameter is out of range; ``field`` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name

    def __reduce__(self) -> tuple[type[SamplingParamError], tuple[str, str]]:
        return type(self), (self.field, str(self))  # crosses a Dask call intact


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop; validated on construction."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    extra_keys: tuple[str, ...] = field(default=())  # LoRA name / cache salt: separate KV
    structured_output: StructuredOutput | None = None  # a grammar the output must match

    def __post_init__(self) -> None:
        # Callers across a wire hand over lists (msgpack, JSON) or one bare stop string.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "extra_keys", tuple(self.extra_keys))
        # Across a wire the grammar arrives as its dict (``StructuredOutput.to_wire``).
        object.__setattr__(
            self, "structured_output", StructuredOutput.from_wire(self.structured_output)
        )
        _require(self.max_tokens >= 1, "max_tokens", self.max_tokens, "an integer >= 1")
        _require(self.temperature >= 0.0, "temperature", self.temperature, "a number >= 0")
        _require(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "a number in (0, 1]")
        _require(self.top_k >= 0, "top_k", self.top_k, "an integer >= 0 (0 disables it)")
        _require(all(s for s in self.stop), "stop", self.stop, "non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        message = f"SamplingParams '{name}' has value {value!r}; expected {expected}"
        raise SamplingParamError(name, message)
