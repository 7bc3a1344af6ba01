"""Tool calls and reasoning on /v1/chat/completions with the official ``openai`` client.

Engine: the scripted agent (``out=python:scripted_agent.py``), which writes Hermes
``<tool_call>`` markup a few characters per delta when it is offered tools.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.control_plane.api.agents.conftest import MODEL

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def client(agent_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{agent_server}/v1", api_key="unused", max_retries=0)


def test_tool_call_whole(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].id.startswith("call_")
    function = calls[0].function  # type: ignore[union-attr]
    assert (function.name, json.loads(function.arguments)) == (
        "get_weather",
        {"city": "Paris", "days": 3},
    )


def _streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[str, list[Any], list[Any]]:
    stream = client.chat.completions.create(model=MODEL, messages=ASK, stream=True, **kwargs)
    content, pieces, reasons = "", [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        pieces += delta.tool_calls or []
        reasons.append(chunk.choices[0].finish_reason)
    return content, pieces, reasons


def test_tool_call_streamed_id_and_name_first_then_arguments(client: openai.OpenAI) -> None:
    content, pieces, reasons = _streamed(client, tools=[WEATHER])
    assert content == ""  # no markup as content
    first, rest = pieces[0], pieces[1:]
    assert first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather"
    assert len(rest) > 2 and all(p.id is None and p.function.name is None for p in rest)
    arguments = first.function.arguments + "".join(p.function.arguments for p in rest)
    assert json.loads(arguments) == {"city": "Paris", "days": 3}
    assert reasons[-1] == "tool_calls"


@pytest.mark.parametrize(
    "choice",
    ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}],
)
def test_every_choice_that_calls(client: openai.OpenAI, choice: Any) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice=choice,
        parallel_tool_calls=False,  # type: ignore[arg-type, list-item]
    )
    calls = reply.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


def test_choice_none_hides_the_tools(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none"
    )  # type: ignore[arg-type, list-item]
    assert reply.choices[0].message.content == "Hello from the scripted agent."
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


def test_round_trip_with_the_tool_result(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    call = (first.choices[0].message.tool_calls or [])[0]
    messages: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    assert second.choices[0].message.content == "The tool said: 18 C and sunny."
    assert second.choices[0].finish_reason == "stop"


def test_reasoning_content_whole_and_streamed(client: openai.OpenAI) -> None:
    think = [{"role": "user", "content": "think: the capital of France?"}]
    reply = client.chat.completions.create(model=MODEL, messages=think)  # type: ignore[arg-type]
    message = reply.choices[0].message
    assert (message.content, getattr(message, "reasoning_content", None)) == (
        "Paris.",
        "I should answer.",
    )
    stream = client.chat.completions.create(model=MODEL, messages=think, stream=True)  # type: ignore[arg-type]
    content = reasoning = ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
    assert (content, reasoning) == ("Paris.", "I should answer.")


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "function tools only"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "'x', which is not in 'tools'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"functions": [{"name": "f"}]}, "functions", "send 'tools'"),
    ],
)
def test_bad_tool_fields_are_named(
    client: openai.OpenAI, extra: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, extra_body=extra)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and says in error["message"]


def test_unknown_endpoint_names_the_served_ones(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model=MODEL, input="x")
    message = str(caught.value)
    assert "POST /v1/embeddings is not an endpoint" in message
    for endpoint in ("POST /v1/chat/completions", "POST /v1/responses", "POST /v1/messages"):
        assert endpoint in message
