"""What ``out=openai`` sends to the server and reads back: pure functions, no I/O.

Design decisions:

- Requests go to ``/v1/completions`` with the prompt as token ids: the control plane has
  already applied the chat template and tokenized, so the server sees exactly the tokens
  the router hashed (its prefix cache and ours agree on what a prompt is), and chat,
  Responses and Messages requests all forward the same way.
- Output comes back as token ids (``return_token_ids``, vLLM's extension) and is
  detokenized here by ``backend_kit.RequestProgress``, so text, stop strings, usage and
  migration's resume point behave as with every other engine. A server that sends no
  token ids still works: its text is taken as it comes (one item per chunk).
- Sampling fields are forwarded under vLLM's names. The OpenAI fields are always sent;
  vLLM's extensions only when they differ from their defaults, so a plain request
  stays a plain OpenAI request. Stop strings are sent too (the server stops generating
  at once) and also checked here (what the client sees is decided in one place).
- Logprobs are asked with ``return_tokens_as_token_ids``: each token comes back as
  ``token_id:N``, never as text that could be ambiguous.
- Fields the server cannot be asked for are refused by name before anything is sent
  (``refusal``); the control plane refuses structured outputs for ``out=openai`` first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dynask.actors.api.outputs import TokenLogprob
from dynask.actors.api.sampling_params import SamplingParams

_TOKEN_PREFIX = "token_id:"


class UpstreamError(RuntimeError):
    """The server answered a request with an error (an HTTP status or an error event)."""


def refusal(params: SamplingParams) -> str | None:
    """Why ``params`` cannot be forwarded (naming the field), or None."""
    if params.structured_output is not None:
        return (
            "'response_format' (structured outputs) is not forwarded by out=openai; "
            "serve the model with out=torch or out=vllm for grammar-constrained output"
        )
    if params.extra_keys:
        return (
            "'extra_keys' (LoRA adapters, cache salts) is not forwarded by out=openai; "
            "name the adapter as the upstream model instead (engine argument upstream_model)"
        )
    return None


def completion_body(
    model: str, prompt: list[int], params: SamplingParams, max_tokens: int
) -> dict[str, Any]:
    """The JSON body of one streamed ``/v1/completions`` request."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": params.top_p,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
    if params.logprobs is not None:
        body["logprobs"] = params.logprobs
        body["return_tokens_as_token_ids"] = True
    extensions = {  # vLLM's names; sent only when not the default
        "top_k": (params.top_k, 0),
        "stop_token_ids": (list(params.stop_token_ids), []),
        "ignore_eos": (params.ignore_eos, False),
        "skip_special_tokens": (params.skip_special_tokens, True),
        "repetition_penalty": (params.repetition_penalty, 1.0),
        "min_tokens": (params.min_tokens, 0),
    }
    body.update({key: value for key, (value, default) in extensions.items() if value != default})
    return body


@dataclass(frozen=True)
class Chunk:
    """One streamed event of the server, as far as this engine reads it."""

    token_ids: tuple[int, ...] | None = None  # None: the server sent text only
    text: str = ""
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_tokens: int | None = None  # set on the usage event
    completion_tokens: int | None = None
    cached_tokens: int = 0


def parse_event(data: str, logprobs: int | None) -> Chunk | None:
    """One SSE ``data:`` payload; None for ``[DONE]``. ``UpstreamError`` for an error event."""
    if data.strip() == "[DONE]":
        return None
    try:
        event = json.loads(data)
    except json.JSONDecodeError as exc:
        raise UpstreamError(f"the server sent an event that is not JSON: {data[:200]!r}") from exc
    if not isinstance(event, dict):
        raise UpstreamError(f"the server sent an event that is not an object: {data[:200]!r}")
    if "error" in event:
        raise UpstreamError(f"the server reported an error mid-stream: {error_text(event)}")
    usage = event.get("usage")
    choices = event.get("choices") or []
    if not choices:
        return _usage_chunk(usage) if isinstance(usage, dict) else Chunk()
    choice = choices[0]
    ids = choice.get("token_ids")
    return Chunk(
        token_ids=None if ids is None else tuple(int(t) for t in ids),
        text=str(choice.get("text") or ""),
        finish_reason=choice.get("finish_reason"),
        logprobs=None if logprobs is None else _logprobs(choice.get("logprobs"), logprobs),
    )


def _usage_chunk(usage: dict[str, Any]) -> Chunk:
    details = usage.get("prompt_tokens_details") or {}
    return Chunk(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )


def _logprobs(data: Any, wanted: int) -> tuple[TokenLogprob, ...]:
    """The completions API's logprobs (``token_id:N`` keys) as ours, top ``wanted`` each."""
    if not isinstance(data, dict):
        return ()
    result = []
    tops = data.get("top_logprobs") or []
    for index, (token, value) in enumerate(
        zip(data.get("tokens") or [], data.get("token_logprobs") or [], strict=False)
    ):
        top = tops[index] if index < len(tops) and isinstance(tops[index], dict) else {}
        ranked = sorted(((float(v), _token_id(k)) for k, v in top.items()), reverse=True)
        best = tuple((token_id, lp) for lp, token_id in ranked[:wanted])
        result.append(TokenLogprob(_token_id(token), float(value), best))
    return tuple(result)


def _token_id(token: str) -> int:
    if not token.startswith(_TOKEN_PREFIX):
        raise UpstreamError(
            f"the server named a logprob token {token!r}, not 'token_id:N'; out=openai needs "
            "a server that honours return_tokens_as_token_ids (vLLM does)"
        )
    return int(token.removeprefix(_TOKEN_PREFIX))


def error_text(body: Any) -> str:
    """The message of an OpenAI-shaped error body, or the body itself."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(body)[:500]
