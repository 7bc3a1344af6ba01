"""Per-request sampling parameters: how to pick tokens and when to stop.

Built and validated once (in the control plane, or by a direct caller of an engine) and
handed to whichever backend serves the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynask.actors.api.structured_output import StructuredOutput

MAX_LOGPROBS = 20  # the most top logprobs a request may ask for (OpenAI's limit)
MIN_REPETITION_PENALTY = 0.01  # positive logits are divided by it: keep them finite
_LP = f"None or an integer in [0, {MAX_LOGPROBS}]"


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
    # Logits processing (``actors.engine.logits.processing``), before the draw:
    presence_penalty: float = 0.0  # OpenAI: minus this once for a token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this per time a token was generated
    repetition_penalty: float = 1.0  # CTRL / vLLM: over prompt and output tokens; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    min_tokens: int = 0  # EOS and stop token ids are masked until this many are generated
    # Logprobs after the draw (``actors.engine.logits.logprobs``): None = none; k = the chosen
    # token's logprob and the k most likely tokens' (0: the chosen token's only).
    logprobs: int | None = None
    # A migrated request's prompt ends with this many tokens it generated before the move
    # (``control_plane.reliability.migration``): the penalties and ``min_tokens`` count them
    # as output, so the continuation is drawn as the undisturbed request's would have been.
    output_in_prompt: int = 0

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
        # Pairs, not a map: msgpack refuses integer map keys by default.
        bias = tuple((int(token), float(value)) for token, value in self.logit_bias)
        object.__setattr__(self, "logit_bias", bias)
        _require(self.max_tokens >= 1, "max_tokens", self.max_tokens, "an integer >= 1")
        _require(self.temperature >= 0.0, "temperature", self.temperature, "a number >= 0")
        _require(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "a number in (0, 1]")
        _require(self.top_k >= 0, "top_k", self.top_k, "an integer >= 0 (0 disables it)")
        _require(all(s for s in self.stop), "stop", self.stop, "non-empty strings")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(-2.0 <= value <= 2.0, name, value, "a number in [-2, 2]")
        penalty = self.repetition_penalty
        low = MIN_REPETITION_PENALTY
        _require(low <= penalty <= 2.0, "repetition_penalty", penalty, f"a number in [{low}, 2]")
        _require(self.min_tokens >= 0, "min_tokens", self.min_tokens, "an integer >= 0")
        _require(
            all(-100.0 <= value <= 100.0 for _, value in bias),
            "logit_bias",
            self.logit_bias,
            "biases in [-100, 100]",
        )
        shown = self.output_in_prompt
        _require(shown >= 0, "output_in_prompt", shown, "an integer >= 0")
        logprobs = self.logprobs
        _require(logprobs is None or 0 <= logprobs <= MAX_LOGPROBS, "logprobs", logprobs, _LP)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def processes_logits(self) -> bool:
        """True when the logits change before the draw (penalties, bias, min_tokens)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        message = f"SamplingParams '{name}' has value {value!r}; expected {expected}"
        raise SamplingParamError(name, message)
