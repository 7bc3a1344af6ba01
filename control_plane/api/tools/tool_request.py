"""The tool fields of a chat request, validated: ``tools``, ``tool_choice``,
``parallel_tool_calls``, and the tool parts of messages (an assistant's ``tool_calls``, a
``tool`` message's ``tool_call_id``).

Every rule names the field and the bad value, as the rest of the request schema does.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from dynask.control_plane.api.errors import invalid

CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None
    parameters: dict[str, Any]  # a JSON schema of the arguments object

    def openai_shape(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """The tools offered, and whether (or which) the model must call."""

    tools: tuple[FunctionTool, ...]
    choice: str  # none | auto | required | named
    named: str | None = None  # the function ``tool_choice`` names
    parallel: bool = True

    @property
    def offered(self) -> bool:
        """Whether the model sees the tools at all (``none`` hides them)."""
        return self.choice != "none" and bool(self.tools)

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    def tool(self, name: str) -> FunctionTool | None:
        return next((t for t in self.tools if t.name == name), None)

    def arguments_schema(self) -> dict[str, Any] | None:
        """The JSON schema the whole output must match when a call is forced: the named
        function's arguments, or (``required``) an array of calls of any tool."""
        if self.choice == "named" and self.named is not None:
            tool = self.tool(self.named)
            return tool.parameters if tool is not None else None
        if self.choice != "required":
            return None
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "parameters": t.parameters},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in self.tools
        ]
        array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            array["maxItems"] = 1
        return array


def parse_tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools and choice; None when it offers none."""
    if body.get("functions") or body.get("function_call"):
        name = "functions" if body.get("functions") else "function_call"
        raise invalid(name, f"'{name}' is deprecated by OpenAI; send 'tools' and 'tool_choice'")
    raw = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise invalid(
            "parallel_tool_calls",
            f"'parallel_tool_calls' has value {parallel!r}; expected true or false",
        )
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice", "'tool_choice' needs 'tools': the request offers none")
        return None
    if not isinstance(raw, list):
        raise invalid("tools", "'tools' must be an array of function tools")
    tools = tuple(_tool(item, f"tools[{i}]") for i, item in enumerate(raw))
    names = [t.name for t in tools]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise invalid("tools", f"'tools' names the function '{duplicate}' twice")
    mode, named = _choice(choice, names)
    return ToolRequest(tools, mode, named, parallel)


def _tool(item: Any, where: str) -> FunctionTool:
    if not isinstance(item, dict) or item.get("type", "function") != "function":
        kind = item.get("type") if isinstance(item, dict) else type(item).__name__
        raise invalid(
            f"{where}.type",
            f"'{where}' has type {kind!r}; dynask serves function tools only "
            '({"type": "function", "function": {"name": ..., "parameters": {...}}})',
        )
    function = item.get("function")
    if not isinstance(function, dict):
        raise invalid(f"{where}.function", f"'{where}.function' must be an object with a 'name'")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(
            f"{where}.function.name",
            f"'{where}.function.name' has value {name!r}; expected 1-64 letters, digits, "
            "'_', '.' or '-'",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        field = f"{where}.function.description"
        raise invalid(field, f"'{field}' must be a string")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise invalid(
            f"{where}.function.parameters",
            f"'{where}.function.parameters' must be a JSON schema object",
        )
    return FunctionTool(name, description, parameters)


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str) and choice in CHOICES:
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if name in names:
            return "named", name
        raise invalid(
            "tool_choice",
            f"'tool_choice' names the function {name!r}, which is not in 'tools' "
            f"({', '.join(names)})",
        )
    raise invalid(
        "tool_choice",
        f"'tool_choice' has value {choice!r}; use none, auto, required or "
        '{"type": "function", "function": {"name": ...}}',
    )


def tool_message_fields(item: dict[str, Any], where: str) -> dict[str, Any]:
    """The tool parts of a chat message, in the shape chat templates read: an assistant's
    ``tool_calls`` (arguments as objects), a tool message's ``tool_call_id``."""
    role = item.get("role")
    if role == "tool":
        call_id = item.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(
                f"{where}.tool_call_id",
                f"'{where}.tool_call_id' is required on a tool message: the id of the call "
                "it answers",
            )
        fields: dict[str, Any] = {"tool_call_id": call_id}
        if isinstance(item.get("name"), str):
            fields["name"] = item["name"]
        return fields
    calls = item.get("tool_calls")
    if role != "assistant" or not calls:
        return {}
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", f"'{where}.tool_calls' must be an array of calls")
    return {
        "tool_calls": [_history_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    }


def _history_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid(
            where,
            f'\'{where}\' must be {{"id": ..., "type": "function", "function": '
            '{"name": ..., "arguments": "..."}}',
        )
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # else templates print it as it came
            arguments = json.loads(arguments) if arguments.strip() else {}
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
