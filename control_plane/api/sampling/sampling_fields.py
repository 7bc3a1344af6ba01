"""The sampling features' request fields: penalties, logit_bias, min_tokens, logprobs,
n, best_of, echo; and what their values become.

They are ``request_fields`` declarations (``SAMPLING_FIELDS`` on both endpoints,
``CHAT_LOGPROBS`` and ``COMPLETION_CHOICES`` on one each), so the validator and the
OpenAPI document read the same bounds. ``sampling_features`` turns the read values into
``SamplingParams`` keywords; ``best_of`` checks it against ``n`` and ``stream``. A field
the serving engine cannot honour is refused later, by name, once the model's engine kind
is known (``sampling_support``).

The logprobs shapes differ by endpoint: chat sends ``logprobs: true`` and
``top_logprobs: k`` (0–20); completions send ``logprobs: k`` (0–5 at OpenAI; up to 20
here, as vLLM allows). Both become ``SamplingParams.logprobs = k``.
"""

from __future__ import annotations

from typing import Any

from dynask.actors.api.sampling_params import MAX_LOGPROBS, MIN_REPETITION_PENALTY
from dynask.control_plane.api.errors import invalid
from dynask.control_plane.api.request_fields import (
    Boolean,
    Custom,
    Field,
    Integer,
    Number,
    shown,
)

MAX_CHOICES = 16  # n (and best_of) at most: each choice is a sequence on the engine
MAX_MIN_TOKENS = 2**31
MAX_BIAS = 100


def _logit_bias(value: Any) -> list[list[float]]:
    if not isinstance(value, dict):
        raise invalid("logit_bias", "'logit_bias' must be an object of token id -> bias")
    pairs = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise invalid("logit_bias", f"'logit_bias' key {shown(key)} is not a token id")
        number = isinstance(bias, (int, float)) and not isinstance(bias, bool)
        if not number or not -MAX_BIAS <= bias <= MAX_BIAS:
            raise invalid(
                "logit_bias",
                f"'logit_bias[{key}]' has value {shown(bias)}; expected [-{MAX_BIAS}, {MAX_BIAS}]",
            )
        if bias:
            pairs.append([int(key), float(bias)])
    return pairs


def _completions_only(name: str, description: str, neutral: Any) -> Custom:
    """A completions parameter sent to chat: only its neutral value passes."""

    def read(value: Any) -> None:
        if not (type(value) is type(neutral) and value == neutral):
            raise invalid(name, f"'{name}' is a completions parameter; chat does not take it")

    return Custom(
        name,
        f"completions only: {description}",
        json_schema={"enum": [neutral, None]},
        reader=read,
    )


SAMPLING_FIELDS: tuple[Field, ...] = (
    Integer(
        "n",
        "choices per prompt: sibling requests sharing the prompt's cached blocks",
        default=1,
        low=1,
        high=MAX_CHOICES,
    ),
    Number(
        "presence_penalty",
        "minus this from a token's logit once it was generated",
        default=0.0,
        low=-2.0,
        high=2.0,
    ),
    Number(
        "frequency_penalty",
        "minus this from a token's logit per time it was generated",
        default=0.0,
        low=-2.0,
        high=2.0,
    ),
    # Bounded below: a positive logit is divided by it, and a near-zero divisor would
    # overflow the logits to infinity (a NaN distribution for a sampled request).
    Number(
        "repetition_penalty",
        "extension (CTRL, as vLLM): logits of prompt and output tokens divided by it; 1 is off",
        default=1.0,
        low=MIN_REPETITION_PENALTY,
        high=2.0,
    ),
    Custom(
        "logit_bias",
        "token id -> bias added to its logit (-100 bans it, 100 forces it)",
        json_schema={
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {"type": "number", "minimum": -MAX_BIAS, "maximum": MAX_BIAS},
        },
        reader=_logit_bias,
    ),
    Integer(
        "min_tokens",
        "extension: no end-of-sequence or stop token before this many tokens",
        default=0,
        low=0,
        high=MAX_MIN_TOKENS,
    ),
)

CHAT_LOGPROBS: tuple[Field, ...] = (
    Boolean("logprobs", "the log probability of each output token"),
    Integer(
        "top_logprobs",
        "with logprobs: also the k most likely tokens at each position",
        low=0,
        high=MAX_LOGPROBS,
    ),
    _completions_only("best_of", "candidates per prompt", 1),
    _completions_only("echo", "the prompt before the reply", False),
)

COMPLETION_CHOICES: tuple[Field, ...] = (
    Integer(
        "logprobs",
        "the log probability of each output token and of the k most likely ones",
        low=0,
        high=MAX_LOGPROBS,
    ),
    Boolean("echo", "the prompt's text before each choice's"),
    Integer(
        "best_of",
        "candidates per prompt; the n with the highest summed logprob are returned "
        "(>= n; not with stream)",
        low=1,
        high=MAX_CHOICES,
    ),
)


def sampling_features(values: dict[str, Any], chat: bool) -> dict[str, Any]:
    """``SamplingParams`` keywords for the features the read body asks for (none: ``{}``)."""
    features: dict[str, Any] = {}
    for name in ("presence_penalty", "frequency_penalty"):
        if values[name]:
            features[name] = values[name]
    if values["repetition_penalty"] != 1.0:
        features["repetition_penalty"] = values["repetition_penalty"]
    if values["logit_bias"]:
        features["logit_bias"] = values["logit_bias"]
    if values["min_tokens"]:
        features["min_tokens"] = values["min_tokens"]
    logprobs = _chat_logprobs(values) if chat else values["logprobs"]
    if logprobs is not None:
        features["logprobs"] = logprobs
    return features


def best_of(values: dict[str, Any]) -> int:
    """Completions' ``best_of``: candidates per prompt, of which the ``n`` with the highest
    summed token logprob are returned (``>= n``; refused with ``stream``)."""
    value, n = values["best_of"], values["n"]
    if value is None:
        return int(n)
    if value < n:
        raise invalid("best_of", f"'best_of' has value {value}; it must be >= n ({n})")
    if value > n and values["stream"]:
        raise invalid("best_of", "'best_of' above n cannot be streamed; leave out 'stream'")
    return int(value)


def _chat_logprobs(values: dict[str, Any]) -> int | None:
    wanted, top = values["logprobs"], values["top_logprobs"]
    if top is not None and not wanted:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return (top or 0) if wanted else None
