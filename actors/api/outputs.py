"""What an engine hands back for a request: text deltas, why it finished, token usage.

Every backend (built-in, vLLM, mocker, echo, python) produces these, and the control plane
reads nothing else of an engine's output.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # cancelled by the caller


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's logprob and the most likely tokens at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step added to one request: new text and token ids, and the end."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token that ended it
    usage: Usage | None = None  # set on the final delta
    error: str | None = None  # why an aborted request failed (a backend's own error)
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token id, if asked for

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
