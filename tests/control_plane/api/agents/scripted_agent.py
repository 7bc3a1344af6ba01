"""An ``out=python:FILE.py`` engine that plays a tool-calling model, for the client tests.

A tiny random model never calls a tool by itself, so the client flows (call a tool, send
its result, get an answer) need a model whose behaviour is known. This one reads the
rendered prompt (SmolLM2's template, dynask's default Hermes tool format):

- tools offered and no tool result yet: it calls the first tool, writing
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` a few characters per delta
  (so markup is split across deltas), arguments made from the tool's schema: every string
  property "Paris", every integer 3, every number 1.5, every boolean true;
- the last user turn holds a tool result: it answers ``The tool said: RESULT.``;
- a user turn containing "think": ``<think>I should answer.</think>Paris.``;
- otherwise ``Hello from the scripted agent.``
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

VALUES = {"string": "Paris", "integer": 3, "number": 1.5, "boolean": True}


def _first_tool(prompt: str) -> dict[str, Any] | None:
    if "<tools>\n" not in prompt:
        return None
    block = prompt.split("<tools>\n", 1)[1].split("</tools>", 1)[0].strip()
    tool: dict[str, Any] = json.loads(block.splitlines()[0])
    function: dict[str, Any] = tool.get("function", tool)
    return function


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    properties = function.get("parameters", {}).get("properties", {})
    return {name: VALUES.get(schema.get("type"), "x") for name, schema in properties.items()}


def reply(prompt: str) -> str:
    last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
    if "<tool_response>" in last_user:
        result = last_user.split("<tool_response>", 1)[1].split("</tool_response>", 1)[0]
        return f"The tool said: {result.strip()}."
    function = _first_tool(prompt)
    if function is not None:
        call = {"name": function["name"], "arguments": _arguments(function)}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    if "think" in last_user:
        return "<think>I should answer.</think>Paris."
    return "Hello from the scripted agent."


async def generate(request: Any) -> AsyncIterator[str]:
    text = reply(request.prompt_text)
    for start in range(0, len(text), 4):
        yield text[start : start + 4]
