"""Tools on the built-in engine (``out=torch``, the tiny random Llama, two workers): the
prompt carries the tools (SmolLM2's template: dynask's default Hermes format) and the
output goes through the parser, whole and streamed. A random model writes no markup, so
what is checked is that the request is served and its text arrives as content."""

from __future__ import annotations

from typing import Any

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
