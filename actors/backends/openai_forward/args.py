"""``out=openai:URL`` engine arguments: the server's address and how to talk to it.

Design decisions:

- The URL is the engine's own part of the spec (``out=openai:URL``, like the file of
  ``out=python:FILE.py``); everything else is an engine argument, checked here when the
  deployment is made, so a typo fails in the CLI and not inside a worker.
- The URL may be given with or without its ``/v1`` (``http://gpu-1:8000`` and
  ``http://gpu-1:8000/v1`` are the same server): OpenAI clients take the latter, ``vllm
  serve`` prints the former.
- No API key is stored: ``api_key_env`` names an environment variable of the worker that
  holds it, so a key never reaches the database, a deploy file or the admin UI.
- KV events are opt-in and named by their publisher's address (``kv_events_endpoint``,
  ``tcp://HOST:PORT``: what the server's ``--kv-events-config`` binds). Without it the
  engine reports no KV events and the router places its prompts approximately.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_KV_SCHEMES = ("tcp", "ipc")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ForwardArgs:
    """Arguments of an ``out=openai`` engine; each is validated when made."""

    upstream_model: str | None = None  # the name the server knows; None: its only model
    api_key_env: str | None = None  # env var (on the worker) holding the server's API key
    kv_events_endpoint: str | None = None  # tcp://HOST:PORT of the server's KV publisher
    block_size: int | None = None  # the server's KV block size; None: read from its /metrics
    max_model_len: int | None = None  # None: what the server's /v1/models says
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0  # the longest wait for the server's next chunk
    max_connections: int = 256

    def __post_init__(self) -> None:
        for name in ("upstream_model", "api_key_env"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"ForwardArgs {name!r} has value {value!r}; expected a name")
        if self.api_key_env is not None and not _VARIABLE.fullmatch(self.api_key_env):
            raise ValueError(
                f"ForwardArgs 'api_key_env' has value {self.api_key_env!r}; expected the name "
                "of an environment variable (letters, digits, _), e.g. UPSTREAM_API_KEY"
            )
        if self.kv_events_endpoint is not None:
            check_kv_endpoint(self.kv_events_endpoint)
        for name, minimum in (("block_size", 1), ("max_model_len", 2), ("max_connections", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < minimum):
                raise ValueError(
                    f"ForwardArgs {name!r} has value {value!r}; expected an int >= {minimum}"
                )
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"ForwardArgs {name!r} has value {value!r}; expected seconds > 0")


def api_base(url: str) -> str:
    """The server's OpenAI base URL (ending in ``/v1``); ValueError naming a bad one."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"out=openai:URL has URL {url!r}; expected http(s)://HOST[:PORT][/v1], "
            "e.g. out=openai:http://gpu-1:8000/v1"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"out=openai:URL has URL {url!r}; a query or fragment is not allowed")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ValueError(f"out=openai:URL has URL {url!r}: {exc}") from exc
    base = url.strip().rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


def check_kv_endpoint(endpoint: str) -> None:
    """ValueError unless ``endpoint`` is a ZMQ address a subscriber can connect to."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    tcp_ok = scheme == "tcp" and colon and host not in ("", "*") and port.isdigit()
    if not sep or scheme not in _KV_SCHEMES or (scheme == "tcp" and not tcp_ok) or not rest:
        raise ValueError(
            f"ForwardArgs 'kv_events_endpoint' has value {endpoint!r}; expected "
            "tcp://HOST:PORT (the address the server's --kv-events-config publishes on, "
            "with its host, not *) or ipc://PATH"
        )
