"""``ChatDelta``s in OpenAI's chat shapes: a streamed ``delta`` and a whole ``message``.

A streamed call's first piece carries its ``id``, ``type`` and name (with empty or first
arguments), later pieces only ``index`` and more ``function.arguments``, as OpenAI sends.
"""

from __future__ import annotations

from typing import Any

from dynask.control_plane.api.chat_output import ChatDelta, ChatOutputParser
from dynask.control_plane.api.tools.tool_stream import ToolCallDelta


def delta_dict(delta: ChatDelta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    if delta.content:
        out["content"] = delta.content
    if delta.tool_calls:
        out["tool_calls"] = [_piece(p) for p in delta.tool_calls]
    return out


def _piece(piece: ToolCallDelta) -> dict[str, Any]:
    if piece.id is None:
        return {"index": piece.index, "function": {"arguments": piece.arguments}}
    return {
        "index": piece.index,
        "id": piece.id,
        "type": "function",
        "function": {"name": piece.name, "arguments": piece.arguments},
    }


def message_dict(parser: ChatOutputParser, texts: list[str]) -> dict[str, Any]:
    """The whole assistant message of a choice whose deltas' texts are ``texts``."""
    content, reasoning = [], []
    for delta in [*(parser.feed(t) for t in texts), parser.finish()]:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
    calls = parser.calls
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if message["content"] is None and not calls:
        message["content"] = ""
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return message
