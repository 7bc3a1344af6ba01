"""Tools through chat templates: a template that knows tools gets them as transformers
passes them; one that does not (SmolLM2's) gets dynask's default Hermes format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dynask.control_plane.api.chat_output import ChatOptions, plan_chat
from dynask.control_plane.api.errors import APIError
from dynask.control_plane.api.request_schema import parse_chat
from dynask.control_plane.api.tools.templating import knows_tools, render_chat
from dynask.control_plane.api.tools.tool_request import ToolRequest, parse_tool_request

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
]
# A small template in the style of tool-aware ones (Qwen's, Llama 3.1's): it prints the
# tools, each earlier call's arguments as JSON, and tool messages.
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in m.tool_calls %}"
    "CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}\n{% endfor %}assistant:"
)


@pytest.fixture
def tokenizer(tokenizer_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_folder)


@dataclass(frozen=True)
class _Chat:
    messages: list[dict[str, Any]]
    tools: ToolRequest | None


def _request(**fields: Any) -> _Chat:
    body = {"model": "m", "messages": HISTORY, **fields}
    messages = parse_chat(body).messages
    assert messages is not None
    return _Chat(messages, parse_tool_request(body))


def test_a_template_with_tools_gets_them_and_the_calls_as_objects(tokenizer: Any) -> None:
    tokenizer.chat_template = TOOL_TEMPLATE
    assert knows_tools(tokenizer)
    request = _request(tools=[TOOL])
    text = render_chat(tokenizer, request.messages, request.tools, "m")
    assert text == (  # transformers renders with trim_blocks: no newline after a tag
        'TOOLS:get_weather;user: Weather?assistant: CALL get_weather {"city": "Paris"}'
        "tool: 18 Cassistant:"
    )


def test_a_template_without_tools_gets_the_default_hermes_format(tokenizer: Any) -> None:
    assert not knows_tools(tokenizer)
    request = _request(tools=[TOOL])
    text = render_chat(tokenizer, request.messages, request.tools, "m")
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou can call functions")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in text


def test_choice_none_renders_no_tools(tokenizer: Any) -> None:
    request = _request(tools=[TOOL], tool_choice="none")
    text = render_chat(tokenizer, request.messages, request.tools, "m")
    assert "<tools>" not in text and "<tool_call>" in text  # the history still renders


@pytest.mark.parametrize("engine", ["echo", "mocker"])
def test_engines_without_a_model_refuse_tools(tokenizer: Any, engine: str) -> None:
    request = _request(tools=[TOOL])
    with pytest.raises(APIError) as caught:
        plan_chat(tokenizer, request.messages, request.tools, ChatOptions(), "m", {engine})
    assert caught.value.param == "tools"
    assert f"served by the {engine} engine, which writes no model text" in caught.value.message


def test_plan_follows_the_parser_flags(tokenizer: Any) -> None:
    request = _request(tools=[TOOL])
    options = ChatOptions(tool_call_parser="mistral", reasoning_parser="qwen3")
    _, plan = plan_chat(tokenizer, request.messages, request.tools, options, "m", {"torch"})
    assert plan.tool_format is not None and plan.tool_format.name == "mistral"
    assert plan.reasoning and plan.sampling == {"skip_special_tokens": False}
    _, default = plan_chat(
        tokenizer, request.messages, request.tools, ChatOptions(), "m", {"torch"}
    )
    assert default.tool_format is not None and default.tool_format.name == "hermes"
    assert not default.reasoning


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"tools": {"a": 1}}, "tools", "'tools' must be an array of function tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
            "'tools[0].function.name' has value 'bad name'",
        ),
        ({"tools": [TOOL, TOOL]}, "tools", "names the function 'get_weather' twice"),
        ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice", "has value 'always'"),
        ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "'yes'"),
    ],
)
def test_bad_tool_fields(fields: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(APIError) as caught:
        _request(**fields)
    assert caught.value.param == param and message in caught.value.message


def test_a_tool_message_needs_its_call_id() -> None:
    with pytest.raises(APIError) as caught:
        parse_chat({"model": "m", "messages": [{"role": "tool", "content": "x"}]})
    assert caught.value.param == "messages[0].tool_call_id"


def test_completions_refuse_tools() -> None:
    from dynask.control_plane.api.request_schema import parse_completion

    with pytest.raises(APIError) as caught:
        parse_completion({"model": "m", "prompt": "x", "tools": [TOOL]})
    assert caught.value.param == "tools"
