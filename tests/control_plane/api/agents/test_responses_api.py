"""The Responses API with the ``openai`` client: whole and streamed, function tools and
``function_call_output``, ``store`` + ``previous_response_id``, retrieve and delete,
refusals.

Engine: the scripted agent (``out=python:scripted_agent.py``).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.control_plane.api.agents.conftest import MODEL

pytestmark = pytest.mark.slow

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


@pytest.fixture
def client(agent_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{agent_server}/v1", api_key="unused", max_retries=0)


def test_text_reply_with_instructions_and_usage(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Hello", instructions="Be brief.")
    assert response.status == "completed"
    assert response.output_text == "Hello from the scripted agent."
    assert response.instructions == "Be brief."
    assert response.usage is not None and response.usage.output_tokens == 8
    assert response.usage.total_tokens == response.usage.input_tokens + 8


def test_function_call_then_its_output_by_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call"
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[WEATHER],
    )
    assert second.output_text == "The tool said: 18 C."
    assert second.previous_response_id == first.id


def test_function_call_output_in_the_input_items(client: openai.OpenAI) -> None:
    items: Any = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
    ]
    response = client.responses.create(model=MODEL, input=items, tools=[WEATHER], store=False)
    assert response.output_text == "The tool said: rain."
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        client.responses.retrieve(response.id)


def test_streamed_events_in_order(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 2 and "".join(deltas) == '{"city": "Paris"}'
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = list(client.responses.create(model=MODEL, input="Hello", stream=True))
    assert "".join(e.delta for e in text if e.type == "response.output_text.delta") == (
        "Hello from the scripted agent."
    )
    completed = text[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == "Hello from the scripted agent."


def test_reasoning_item(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="think: capital of France?")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output_text == "Paris."


def test_retrieve_and_delete(client: openai.OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="Hello")
    assert client.responses.retrieve(created.id).output_text == "Hello from the scripted agent."
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=created.id)


def test_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Hello", max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "web_search"}, "tools[0].type"),
        ({"type": "file_search", "vector_store_ids": ["v"]}, "tools[0].type"),
        (
            {
                "type": "computer_use_preview",
                "display_width": 1,
                "display_height": 1,
                "environment": "browser",
            },
            "tools[0].type",
        ),
    ],
)
def test_built_in_tools_are_refused(client: openai.OpenAI, tool: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="x", tools=[tool])
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == param
    assert "is not served by dynask" in body["message"]
