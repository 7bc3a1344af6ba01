"""An Anthropic Messages request, translated into the chat request that serves it.

Content blocks become chat messages: ``text`` blocks are joined; an assistant's
``tool_use`` blocks become ``tool_calls``; a user's ``tool_result`` blocks become ``tool``
messages (before the user's own text, in order). ``thinking`` blocks sent back are
dropped, as chat templates drop earlier reasoning; images and documents are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dynask.control_plane.api.errors import invalid

_REFUSED = ("container", "mcp_servers")


@dataclass(frozen=True)
class MessagesRequest:
    model: str
    chat_body: dict[str, Any]  # the chat request that serves it
    stream: bool


def parse_messages(body: Any, count_only: bool = False) -> MessagesRequest:
    if not isinstance(body, dict):
        raise invalid("body", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' is required and must be a non-empty string")
    for name in _REFUSED:
        if body.get(name):
            raise invalid(name, f"'{name}' is not supported by dynask's Messages API")
    thinking = body.get("thinking")
    if thinking is not None and not (
        isinstance(thinking, dict) and thinking.get("type") == "disabled"
    ):
        raise invalid(
            "thinking",
            "'thinking' budgets are not supported: a model that reasons writes <think> "
            "blocks, returned as thinking blocks",
        )
    chat: dict[str, Any] = {"model": model, "messages": _messages(body)}
    if not count_only:
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise invalid(
                "max_tokens", f"'max_tokens' is required: an integer >= 1, not {max_tokens!r}"
            )
        chat["max_tokens"] = max_tokens
        temperature = body.get("temperature")
        if temperature is not None:
            if (
                isinstance(temperature, bool)
                or not isinstance(temperature, (int, float))
                or not 0 <= temperature <= 1
            ):
                raise invalid(
                    "temperature",
                    f"'temperature' has value {temperature!r}; expected a number in [0, 1]",
                )
            chat["temperature"] = temperature
        for name in ("top_p", "top_k"):
            if body.get(name) is not None:
                chat[name] = body[name]
        stop = body.get("stop_sequences")
        if stop:
            if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
                raise invalid(
                    "stop_sequences", "'stop_sequences' must be an array of non-empty strings"
                )
            chat["stop"] = stop
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", f"'stream' has value {stream!r}; expected true or false")
    return MessagesRequest(model, chat, bool(stream))


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if tools:
        if not isinstance(tools, list):
            raise invalid("tools", "'tools' must be an array")
        out["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    if choice is None:
        return out
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice.get("disable_parallel_tool_use") if isinstance(choice, dict) else False:
        out["parallel_tool_calls"] = False
    if kind in ("auto", "none"):
        out["tool_choice"] = kind
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise invalid(
            "tool_choice", f"'tool_choice' has value {choice!r}; use auto, any, tool or none"
        )
    return out


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise invalid(
            f"{where}.type",
            f"the tool type {kind!r} is not served by dynask (server tools such as web search "
            "and computer use are not); pass client tools with a name and an input_schema",
        )
    function: dict[str, Any] = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_only(system, "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty array of messages")
    for index, message in enumerate(raw):
        messages += _message(message, f"messages[{index}]")
    return messages


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise invalid(f"{where}.role", f"'{where}' must have the role user or assistant")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"'{where}.content' must be a string or content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for number, block in enumerate(content):
        spot = f"{where}.content[{number}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            text = _text_only(block.get("content") or "", f"{spot}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": text}
            )
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise invalid(
                f"{spot}.type",
                f"content blocks of type {kind!r} are not supported in {role} messages; "
                "send text, tool_use (assistant) and tool_result (user) blocks",
            )
    out = list(results)
    if texts or calls or not results:
        turn: dict[str, Any] = {"role": role, "content": "".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    return out


def _text_only(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in value
    ):
        return "".join(str(b.get("text", "")) for b in value)
    raise invalid(where, f"'{where}' must be a string or text blocks")
