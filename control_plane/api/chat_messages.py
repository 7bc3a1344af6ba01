"""The ``messages`` of a chat request: their JSON Schema and their reader.

A message is ``role`` and ``content`` (a string or text parts; ``developer`` reads as
``system``), plus the keys clients send back from earlier turns (``name``,
``tool_call_id``, ``refusal``: accepted; ``tool_calls``, ``audio``: refused unless empty,
as tools and audio are not served). Any other key is refused by name.
"""

from __future__ import annotations

from typing import Any

from dynask.control_plane.api.errors import APIError, invalid
from dynask.control_plane.api.request_fields import Accepted, Field, Refused, shown
from dynask.control_plane.api.tools.tool_request import tool_message_fields

ROLES = ("system", "developer", "user", "assistant", "tool")

_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "additionalProperties": False,
}
# The keys a message may have besides role and content, and the values they may take.
_MESSAGE_EXTRAS: dict[str, Field] = {
    f.name: f
    for f in (
        Accepted(
            "name",
            "the participant's name (chat templates may ignore it)",
            json_schema={"type": "string"},
        ),
        Accepted("tool_call_id", "the call a tool message answers", json_schema={"type": "string"}),
        Accepted(
            "refusal",
            "an assistant's refusal, echoed back",
            json_schema={"type": ["string", "null"]},
        ),
        Accepted(
            "tool_calls",
            "tool calls of an assistant message (read by tools.tool_request)",
            json_schema={"type": "array", "items": {"type": "object"}},
        ),
        Refused("function_call", "deprecated tool call", neutral=(), hint="tools are not served"),
        Refused(
            "audio", "audio of an earlier assistant reply", neutral=(), hint="audio is not served"
        ),
    )
}
MESSAGE_SCHEMA = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": list(ROLES)},
        "content": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}],
            "description": "an assistant message may leave it out or send null",
        },
        **{name: f.document() for name, f in _MESSAGE_EXTRAS.items()},
    },
    "additionalProperties": False,
}


def read_messages(value: Any) -> list[dict[str, Any]]:
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
            f"{where}.role",
            f"'{where}.role' has value {shown(role)}; use one of {', '.join(ROLES)}",
        )
    for key, value in item.items():
        if key in ("role", "content") or value is None:
            continue
        extra = _MESSAGE_EXTRAS.get(key)
        if extra is None:
            raise invalid(
                f"{where}.{key}",
                f"'{where}' has the key {shown(key)}, which dynask does not serve",
                code="unknown_parameter",
            )
        try:
            extra.check(value)
        except APIError as exc:
            raise invalid(f"{where}.{key}", f"'{where}.{key}': {exc}") from exc
    message = {"role": "system" if role == "developer" else role, "content": _content(item, where)}
    return {**message, **tool_message_fields(item, where)}


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
        isinstance(part, dict)
        and set(part) == {"type", "text"}
        and part["type"] == "text"
        and isinstance(part["text"], str)
    )
