"""Validation of OpenAI request bodies into the serving pipeline's ``GenerationRequest``.

Every rule names the parameter and the bad value, so a client sees exactly what to fix.
Unknown fields are ignored (clients send ``user``, ``metadata`` …); features we do not
implement (n > 1, penalties, logprobs, tools) are refused explicitly rather than ignored.
Extensions: ``ignore_eos``, ``top_k`` and ``router_mode`` (this request's routing mode,
overriding the server's ``--router-mode``).
"""

from __future__ import annotations

from typing import Any

from dynask.control_plane.api.errors import invalid
from dynask.control_plane.routing.kv_router import ROUTING_MODES
from dynask.control_plane.serving.request import GenerationRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
# Integers cross to the actor as msgpack and seed a torch.Generator: both stop at 64 bits.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_UNSUPPORTED_NONZERO = ("presence_penalty", "frequency_penalty")
_UNSUPPORTED_TRUTHY = ("logprobs", "top_logprobs", "tools", "functions", "suffix", "echo")


def parse_chat(body: Any) -> GenerationRequest:
    body = _object(body)
    return _common(body, messages=_messages(body.get("messages")), prompt=None)


def parse_completion(body: Any) -> GenerationRequest:
    body = _object(body)
    return _common(body, messages=None, prompt=_prompt(body.get("prompt")))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("body", f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _common(
    body: dict[str, Any], messages: list[dict[str, Any]] | None, prompt: str | list[int] | None
) -> GenerationRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' is required and must be a non-empty string")
    _refuse_unsupported(body)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options", "'stream_options' must be an object")
    return GenerationRequest(
        model=model,
        messages=messages,
        prompt=prompt,
        max_tokens=_max_tokens(body),
        sampling=_sampling(body),
        stream=stream,
        include_usage=bool(stream and options and _bool(options, "include_usage", False)),
        router_mode=_router_mode(body.get("router_mode")),
    )


def _router_mode(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value in ROUTING_MODES:
        return value
    raise invalid(
        "router_mode",
        f"'router_mode' has value {value!r}; use one of {', '.join(ROUTING_MODES)}, "
        "or leave it out for the server's default",
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise invalid("n", f"'n' has value {n!r}; only n=1 is supported (send separate requests)")
    for name in _UNSUPPORTED_NONZERO:
        if body.get(name) not in (None, 0, 0.0):
            raise invalid(name, f"'{name}' is not supported by dynask; leave it out or set 0")
    for name in _UNSUPPORTED_TRUTHY:
        if body.get(name):
            raise invalid(name, f"'{name}' is not supported by dynask; leave it out")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise invalid("best_of", f"'best_of' has value {best_of!r}; only 1 is supported")


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "'messages' must be a non-empty array of message objects")
    return [_message(item, index) for index, item in enumerate(value)]


def _message(item: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        raise invalid(where, f"'{where}' must be an object with 'role' and 'content'")
    role = item.get("role")
    if role not in ROLES:
        raise invalid(
            f"{where}.role", f"'{where}.role' has value {role!r}; use one of {', '.join(ROLES)}"
        )
    return {"role": "system" if role == "developer" else role, "content": _content(item, where)}


def _content(item: dict[str, Any], where: str) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if content is None and item.get("role") == "assistant":
        return ""
    if isinstance(content, list) and all(_is_text_part(p) for p in content):
        return "".join(p["text"] for p in content)
    raise invalid(
        f"{where}.content",
        f'\'{where}.content\' must be a string or an array of text parts ({{"type": "text", '
        '"text": ...}}); images and audio are not supported',
    )


def _is_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        return [int(t) for t in value]
    raise invalid(
        "prompt",
        "'prompt' must be a non-empty string or an array of token ids (one prompt per request)",
    )


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise invalid(name, f"'{name}' has value {value!r}; expected an integer >= 1")
        return int(value)
    return None


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None:
        sampling["temperature"] = temperature
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p is not None:
        if top_p == 0.0:
            raise invalid("top_p", "'top_p' has value 0; expected a number in (0, 1]")
        sampling["top_p"] = top_p
    top_k = _integer(body, "top_k", -1, INT64_MAX)
    if top_k is not None:
        sampling["top_k"] = max(0, top_k)
    seed = _integer(body, "seed", INT64_MIN, INT64_MAX)
    if seed is not None:
        sampling["seed"] = seed
    sampling["stop"] = _stop(body.get("stop"))
    sampling["ignore_eos"] = _bool(body, "ignore_eos", False)
    return sampling


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) > 4
        or not all(isinstance(s, str) and s for s in value)
    ):
        raise invalid("stop", "'stop' must be a non-empty string or an array of up to 4 of them")
    return tuple(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise invalid(name, f"'{name}' has value {value!r}; expected an integer in [{low}, {high}]")
    return int(value)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise invalid(
            name, f"'{name}' has value {value!r}; expected a number in [{low:g}, {high:g}]"
        )
    return float(value)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"'{name}' has value {value!r}; expected true or false")
    return value


def _is_int(value: Any) -> bool:
    """An integer as JSON Schema has it: ``5`` and ``5.0`` are both integers."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)
