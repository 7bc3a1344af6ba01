"""What ``out=openai`` learns of its server when it starts, and whether it is still there.

Design decisions:

- ``probe`` fails the actor's start with a clear error when the server cannot serve it
  (unreachable, no model, several models and none named, a different tokenizer), so a
  wrong URL shows in the deployment's status instead of as 500s later.
- The model's context comes from ``/v1/models`` (vLLM reports ``max_model_len``); the
  KV block size and block count from vLLM's ``vllm:cache_config_info`` metric. Servers
  that report neither work too: the context is then the ``max_model_len`` argument.
- Tokenizer check: the server's ``/tokenize`` (vLLM's) must give the same ids as ours
  for a probe text. Token ids are what this engine sends and reads, so another tokenizer
  would turn every request into garbage; a server without ``/tokenize`` is trusted.
- ``reachable`` is the loss test: after a broken stream, one cheap ``GET /v1/models``
  tells a dead server (its requests must move to another actor) from one failed request.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import httpx

from dynask.actors.backends.backend_kit import DEFAULT_MAX_MODEL_LEN
from dynask.actors.backends.openai_forward.wire import error_text

log = logging.getLogger(__name__)

PROBE_TEXT = "The capital of France is Paris. 1234 + 5678 = 6912; naïve café ✓"
_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class UpstreamUnavailableError(RuntimeError):
    """The server cannot be reached, or cannot serve this engine."""


@dataclass(frozen=True)
class UpstreamInfo:
    """The server as this engine found it."""

    model: str  # the name requests carry
    max_model_len: int | None  # None: the server does not say
    block_size: int | None = None  # vLLM's KV block size, from its metrics
    num_kv_blocks: int = 0


def probe(client: httpx.Client, base: str, wanted_model: str | None) -> UpstreamInfo:
    """Asks the server at ``base`` (ending in /v1) for its model and cache shape."""
    models = _get_json(client, f"{base}/models")
    entries = [m for m in models.get("data") or [] if isinstance(m, dict) and "id" in m]
    names = [str(m["id"]) for m in entries]
    if wanted_model is None:
        if len(names) != 1:
            raise UpstreamUnavailableError(
                f"out=openai:{base} serves {len(names)} models ({', '.join(names) or 'none'}); "
                "name the one to use with the engine argument upstream_model"
            )
        wanted_model = names[0]
    elif wanted_model not in names:
        raise UpstreamUnavailableError(
            f"out=openai:{base} does not serve model {wanted_model!r}; it serves "
            f"{', '.join(names) or 'none'}"
        )
    entry = entries[names.index(wanted_model)]
    context = entry.get("max_model_len")
    block_size, num_blocks = _cache_shape(client, base)
    return UpstreamInfo(
        wanted_model, int(context) if isinstance(context, int) else None, block_size, num_blocks
    )


def check_tokenizer(client: httpx.Client, base: str, model: str, tokenizer: Any) -> None:
    """Raises unless the server tokenizes ``PROBE_TEXT`` as ``tokenizer`` does."""
    root = base.removesuffix("/v1")
    ours = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
    try:
        response = client.post(
            f"{root}/tokenize",
            json={"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False},
        )
    except httpx.HTTPError as exc:
        raise UpstreamUnavailableError(f"out=openai:{base} did not answer: {exc}") from exc
    if response.status_code in (404, 405):
        log.info("out=openai:%s has no /tokenize; its tokenizer is not checked", base)
        return
    theirs = response.json().get("tokens") if response.is_success else None
    if theirs != ours:
        raise UpstreamUnavailableError(
            f"out=openai:{base} tokenizes differently from this deployment's model argument "
            f"({theirs!r} there, {ours!r} here); give the deployment the model the server "
            "serves (its tokenizer is what turns text into the token ids sent)"
        )


async def reachable(client: httpx.AsyncClient, base: str, timeout_s: float) -> bool:
    """Whether the server answers ``GET /v1/models`` within ``timeout_s``."""
    try:
        await client.get(f"{base}/models", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return True


def _get_json(client: httpx.Client, url: str) -> dict[str, Any]:
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise UpstreamUnavailableError(f"out=openai: {url} did not answer: {exc}") from exc
    if not response.is_success:
        raise UpstreamUnavailableError(
            f"out=openai: {url} answered {response.status_code}: {error_text(_json(response))}"
        )
    body = _json(response)
    if not isinstance(body, dict):
        raise UpstreamUnavailableError(f"out=openai: {url} answered {body!r}, not a model list")
    return body


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:500]


def _cache_shape(client: httpx.Client, base: str) -> tuple[int | None, int]:
    """(block size, block count) from vLLM's ``/metrics``; (None, 0) where not there."""
    try:
        response = client.get(f"{base.removesuffix('/v1')}/metrics")
    except httpx.HTTPError:
        return None, 0
    match = _CACHE_INFO.search(response.text) if response.is_success else None
    if match is None:
        return None, 0
    labels = dict(_LABEL.findall(match["labels"]))
    size, blocks = labels.get("block_size", ""), labels.get("num_gpu_blocks", "")
    return (int(size) if size.isdigit() else None), (int(blocks) if blocks.isdigit() else 0)


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The ``Authorization`` header from the named environment variable (none if None)."""
    if api_key_env is None:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise ValueError(
            f"ForwardArgs 'api_key_env' names {api_key_env!r}, which is not set (or empty) "
            "where this engine runs"
        )
    return {"Authorization": f"Bearer {key}"}


def context_length(asked: int | None, served: int | None) -> int:
    """The context to serve: the asked one, at most the server's."""
    if served is None:
        return asked or DEFAULT_MAX_MODEL_LEN
    if asked is not None and asked > served:
        log.warning(
            "out=openai: max_model_len %d exceeds the server's %d; using %d", asked, served, served
        )
    return min(asked or served, served)


def error_of(answer: bytes) -> str:
    """The message of an error response's body."""
    try:
        return error_text(json.loads(answer))
    except ValueError:
        return answer.decode(errors="replace")[:500]
