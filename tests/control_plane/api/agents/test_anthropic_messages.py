"""The Anthropic Messages API with the ``anthropic`` client: text, tools and
``tool_result``, streaming events, count_tokens, Anthropic-shaped errors.

Engine: the scripted agent (``out=python:scripted_agent.py``).
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.control_plane.api.agents.conftest import MODEL

pytestmark = pytest.mark.slow

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def client(agent_server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=agent_server, api_key="unused", max_retries=0)


def test_text_message(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hi"}],
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5},
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello from the scripted agent."  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 8


def test_tool_use_then_tool_result(client: anthropic.Anthropic) -> None:
    first = client.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    [block] = first.content
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert (block.name, block.input) == ("get_weather", {"city": "Paris"})
    second = client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump()]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "18 C"}],
            },
        ],
    )
    assert second.content[0].text == "The tool said: 18 C."  # type: ignore[union-attr]


def test_stream_events_and_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("input_json") > 2  # the SDK's event per input_json_delta
    assert final.stop_reason == "tool_use"
    assert final.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]
    text = client.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "think"}]
    )
    with text as stream:
        streamed = "".join(stream.text_stream)
        blocks = stream.get_final_message().content
    assert streamed == "Paris."
    assert [b.type for b in blocks] == ["thinking", "text"]
    assert blocks[0].thinking == "I should answer."  # type: ignore[union-attr]


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        stop_sequences=["scripted"],
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "scripted"
    assert message.content[0].text == "Hello from the "  # type: ignore[union-attr]


def test_count_tokens(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=ASK)
    with_tools = client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER])
    assert 0 < counted.input_tokens < with_tools.input_tokens


def test_errors_are_anthropic_shaped(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        # (this client version sends sampling options only as extra fields)
        client.messages.create(
            model=MODEL, max_tokens=8, messages=ASK, extra_body={"temperature": 1.5}
        )
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "'temperature' has value 1.5; expected a number in [0, 1]",
        },
    }
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=8, messages=ASK)
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["error"]["type"] == "not_found_error"
