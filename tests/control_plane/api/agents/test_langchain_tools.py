"""LangChain's ``ChatOpenAI.bind_tools`` and an agent loop that calls a tool and answers.

Engine: the scripted agent (``out=python:scripted_agent.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.control_plane.api.agents.conftest import MODEL

pytestmark = pytest.mark.slow


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"18 C in {city}"


def _model(base: str) -> Any:
    chat = ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model=MODEL, max_retries=0)  # type: ignore[arg-type]
    return chat.bind_tools([get_weather])


def test_bind_tools_gives_tool_calls(agent_server: str) -> None:
    reply = _model(agent_server).invoke("What is the weather in Paris?")
    assert isinstance(reply, AIMessage)
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_streamed_tool_call_chunks_assemble(agent_server: str) -> None:
    chunks = list(_model(agent_server).stream("What is the weather in Paris?"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert len(chunks) > 3  # the arguments came in pieces


def test_agent_loop_calls_the_tool_and_answers(agent_server: str) -> None:
    model = _model(agent_server)
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
    for _ in range(3):
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            result = get_weather.invoke(call["args"])
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    assert messages[-1].content == "The tool said: 18 C in Paris."
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
