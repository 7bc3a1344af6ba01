"""The OpenAI Agents SDK ``Runner`` with a function tool: through the Responses API (its
default model) and through ``OpenAIChatCompletionsModel``.

Engine: the scripted agent (``out=python:scripted_agent.py``).
"""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.control_plane.api.agents.conftest import MODEL

pytestmark = pytest.mark.slow


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"18 C in {city}"


def _run(model: OpenAIResponsesModel | OpenAIChatCompletionsModel) -> str:
    set_tracing_disabled(True)
    agent = Agent(
        name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model
    )

    async def main() -> str:
        result = await Runner.run(agent, "What is the weather in Paris?")
        return str(result.final_output)

    return asyncio.run(main())


def _client(base: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_runner_through_the_responses_api(agent_server: str) -> None:
    model = OpenAIResponsesModel(model=MODEL, openai_client=_client(agent_server))
    assert _run(model) == "The tool said: 18 C in Paris."


def test_runner_through_chat_completions(agent_server: str) -> None:
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=_client(agent_server))
    assert _run(model) == "The tool said: 18 C in Paris."
