"""A Responses API request, translated into the chat request that serves it.

Input items become chat messages: ``message`` items (or ``{"role", "content"}``), the
model's earlier ``function_call``s (an assistant message with ``tool_calls``) and
``function_call_output``s (``tool`` messages); ``reasoning`` items the server wrote are
dropped, as chat templates drop earlier reasoning. Function tools become chat tools;
the built-in tools (web search, file search, computer use, ...) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynask.control_plane.api.errors import invalid

BUILT_IN_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "computer",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "mcp",
    "custom",
    "apply_patch",
)
# Fields whose only served value is "not set"; anything else is refused by name.
_REFUSED = (
    "background",
    "conversation",
    "prompt",
    "include",
    "top_logprobs",
    "max_tool_calls",
    "prompt_cache_key",
)
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


@dataclass(frozen=True)
class ResponsesRequest:
    model: str
    chat_body: dict[str, Any]  # the chat request that serves it (without messages)
    input_messages: list[dict[str, Any]]  # this request's input, as chat messages
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    echo: dict[str, Any]  # request fields the response object repeats


def parse_responses(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise invalid("body", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' is required and must be a non-empty string")
    for name in _REFUSED:
        if body.get(name) not in (None, [], False):
            raise invalid(name, f"'{name}' is not supported by dynask's Responses API")
    reasoning = body.get("reasoning")
    if reasoning not in (None, {}) and not (
        isinstance(reasoning, dict) and all(v is None for v in reasoning.values())
    ):
        raise invalid(
            "reasoning",
            "'reasoning' options (effort, summary) are not supported: a model that reasons "
            "writes <think> blocks, returned as reasoning items",
        )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions", "'instructions' must be a string")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise invalid("previous_response_id", "'previous_response_id' must be a response id")
    max_output = body.get("max_output_tokens")
    if max_output is not None and (
        isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1
    ):
        raise invalid(
            "max_output_tokens", f"'max_output_tokens' has value {max_output!r}; expected >= 1"
        )
    chat: dict[str, Any] = {"model": model, "stream": False}
    for name in ("temperature", "top_p", "parallel_tool_calls", "seed", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if max_output is not None:
        chat["max_tokens"] = max_output
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    chat.update(_text_format(body.get("text")))
    store = body.get("store", True)
    stream = body.get("stream", False)
    for name, value in (("store", store), ("stream", stream)):
        if value is not None and not isinstance(value, bool):
            raise invalid(name, f"'{name}' has value {value!r}; expected true or false")
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_output,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": previous,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}},
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
        "store": store is not False,
    }
    return ResponsesRequest(
        model=model,
        chat_body=chat,
        input_messages=input_messages(body.get("input")),
        instructions=instructions,
        previous_response_id=previous,
        store=store is not False,
        stream=bool(stream),
        echo=echo,
    )


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid("tools", "'tools' must be an array")
        out["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
    if choice is not None:
        if isinstance(choice, dict):
            if choice.get("type") != "function":
                raise invalid(
                    "tool_choice",
                    f"'tool_choice' of type {choice.get('type')!r} is not supported; use "
                    'none, auto, required or {"type": "function", "name": ...}',
                )
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        out["tool_choice"] = choice
    return out


def _tool(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind in BUILT_IN_TOOLS or (isinstance(kind, str) and kind.startswith("web_search")):
        raise invalid(
            f"{where}.type",
            f"the built-in tool '{kind}' is not served by dynask; pass function tools "
            '({"type": "function", "name": ..., "parameters": {...}}) and run it yourself',
        )
    if kind != "function":
        raise invalid(f"{where}.type", f"'{where}.type' has value {kind!r}; expected 'function'")
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def _text_format(text: Any) -> dict[str, Any]:
    """``text.format`` as the chat API's ``response_format`` (the same grammars)."""
    if text is None:
        return {}
    if not isinstance(text, dict):
        raise invalid("text", '\'text\' must be an object such as {"format": {"type": "text"}}')
    unserved = sorted(set(text) - {"format", "verbosity"})
    if unserved or text.get("verbosity") not in (None, "medium"):
        name = f"text.{unserved[0] if unserved else 'verbosity'}"
        raise invalid(name, f"'{name}' is not supported by dynask; leave it out")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise invalid("text.format.schema", "'text.format.schema' must be a JSON schema object")
        spec = {key: fmt[key] for key in ("name", "description", "strict") if key in fmt}
        return {
            "response_format": {"type": "json_schema", "json_schema": {**spec, "schema": schema}}
        }
    raise invalid(
        "text.format", f"'text.format' has value {fmt!r}; use text, json_object or json_schema"
    )


def input_messages(value: Any) -> list[dict[str, Any]]:
    """The ``input`` (a string or items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "'input' must be a string or a non-empty array of items")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        message = _item(item, f"input[{index}]")
        if message is None:
            continue
        if message.get("tool_calls") and messages and _open_call_turn(messages[-1]):
            messages[-1]["tool_calls"].extend(message["tool_calls"])  # parallel calls
        else:
            messages.append(message)
    if not messages:
        raise invalid("input", "'input' holds no message")
    return messages


def _open_call_turn(message: dict[str, Any]) -> bool:
    return message["role"] == "assistant" and bool(message.get("tool_calls"))


def _item(item: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        raise invalid(where, f"'{where}' must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise invalid(f"{where}.role", f"'{where}.role' has value {role!r}")
        return {"role": role, "content": _text(item.get("content"), where)}
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments", "{}")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise invalid(where, f"'{where}' must have a 'name' and 'arguments' (a JSON string)")
        call_id = item.get("call_id") or item.get("id") or ""
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"{where}.call_id", f"'{where}.call_id' is required")
        if not isinstance(output, str):
            output = _text(output, where)
        return {"role": "tool", "tool_call_id": call_id, "content": output}
    if kind == "reasoning":
        return None
    raise invalid(
        f"{where}.type",
        f"input items of type {kind!r} are not supported; send messages, function_call and "
        "function_call_output items",
    )


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid(
                    f"{where}.content",
                    f"content parts of type {kind!r} are not supported; send text",
                )
            parts.append(str(part.get("text", part.get("refusal", ""))))
        return "".join(parts)
    raise invalid(f"{where}.content", f"'{where}.content' must be a string or text parts")
