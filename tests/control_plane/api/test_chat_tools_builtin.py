"""Tools on the built-in engine (``out=torch``, the tiny random Llama, two workers): the
prompt carries the tools (SmolLM2's template: dynask's default Hermes format) and the
output goes through the parser, whole and streamed. A random model writes no markup, so
what is checked under ``auto`` is that the request is served and its text arrives as
content; under ``required`` and a named function the grammar makes it call, with arguments
that validate against the function's schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]


def test_tools_on_the_builtin_engine(tiny_server: str) -> None:
    client = openai.OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0)
    plain = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=12, temperature=0, tools=TOOLS, tool_choice="none"
    )
    offered = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=12, temperature=0, tools=TOOLS
    )
    assert plain.usage is not None and offered.usage is not None
    # The tools' description is in the prompt only when they are offered.
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    stream = client.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=12, temperature=0, tools=TOOLS, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    whole = offered.choices[0].message.content or ""
    assert streamed == whole and offered.choices[0].message.tool_calls is None
    assert offered.choices[0].finish_reason == "length"


STRICT: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "now",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in STRICT}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "now"}}])
def test_forced_calls_of_a_random_model_validate(tiny_server: str, choice: Any) -> None:
    """The grammar makes the random model's output calls whose arguments validate."""
    client = openai.OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0)
    common: Any = {"model": "tiny", "messages": ASK, "max_tokens": 120, "tools": STRICT}
    common |= {"tool_choice": choice, "parallel_tool_calls": False, "temperature": 1.0}
    for seed in (1, 2):
        reply = client.chat.completions.create(**common, seed=seed)
        choice_ = reply.choices[0]
        assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
        [call] = choice_.message.tool_calls or []
        if isinstance(choice, dict):
            assert call.function.name == "now"  # type: ignore[union-attr]
        name, arguments = call.function.name, call.function.arguments  # type: ignore[union-attr]
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        # Streamed: id and name first, then the arguments in pieces; the same call.
        pieces = [
            piece
            for chunk in client.chat.completions.create(**common, seed=seed, stream=True)
            if chunk.choices
            for piece in chunk.choices[0].delta.tool_calls or []
        ]
        assert pieces[0].id is not None and pieces[0].function.name == name  # type: ignore[union-attr]
        assert "".join(p.function.arguments or "" for p in pieces) == arguments  # type: ignore[union-attr]
