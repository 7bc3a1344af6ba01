"""Structured outputs as clients use them, against a real ``dynask run`` of SmolLM2.

The official ``openai`` client's ``parse()`` with a pydantic model, LangChain's
``with_structured_output`` (``json_schema`` and ``json_mode``) and the OpenAI Agents
SDK's ``output_type`` each send their own form of ``response_format``; each must get
back JSON its own validation accepts. Streaming must assemble to the same text, and
what cannot be served is a 400 that says why (also from an ``out=echo`` server).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.control_plane import server_process as sp

pytestmark = pytest.mark.slow

MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]


class Capital(BaseModel):
    city: str
    country: str


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("structured")
    args = ["--model-name", MODEL, "--workers", "1"]
    with sp.dynask_run(folder, args) as (base, _):
        sp.wait_for_engines(base, 1)
        yield base


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_parse_fills_the_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=QUESTION, response_format=Capital, temperature=0, max_tokens=80
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Capital)
    assert "Paris" in parsed.city
    assert completion.choices[0].finish_reason == "stop"


def test_langchain_with_structured_output_both_methods(base_url: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=MODEL, base_url=f"{base_url}/v1", api_key="unused", temperature=0, max_tokens=80
    )  # type: ignore[call-arg]
    by_schema = chat.with_structured_output(Capital, method="json_schema").invoke(QUESTION)
    assert isinstance(by_schema, Capital)
    prompt = 'What is the capital of France? Reply with JSON: {"city": ..., "country": ...}'
    by_json_mode = chat.with_structured_output(Capital, method="json_mode").invoke(prompt)
    assert isinstance(by_json_mode, Capital)


def test_agents_sdk_output_type(base_url: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # the SDK would send traces to OpenAI
    model = OpenAIChatCompletionsModel(
        model=MODEL, openai_client=openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    )
    agent = Agent(
        name="geography",
        instructions="Answer in JSON.",
        model=model,
        output_type=Capital,
        model_settings=ModelSettings(temperature=0, max_tokens=80),
    )
    result = Runner.run_sync(agent, "What is the capital of France?")
    assert isinstance(result.final_output, Capital)


def test_a_stream_assembles_to_the_same_json(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "cities": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
            "rank": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        "required": ["cities", "rank"],
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    kwargs = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 80}
    whole = client.chat.completions.create(response_format=response_format, **kwargs)  # type: ignore[call-overload]
    chunks = client.chat.completions.create(response_format=response_format, stream=True, **kwargs)  # type: ignore[call-overload]
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    text = whole.choices[0].message.content
    assert "".join(pieces) == text
    assert len([p for p in pieces if p]) > 2
    jsonschema.validate(json.loads(text), schema)


def test_completions_serve_vllm_guided_fields(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    regex = r" [A-Z][a-z]{2,10}\."
    guided = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"guided_regex": regex}
    )
    assert re.fullmatch(regex, guided.choices[0].text)
    choice = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, extra_body={"guided_choice": [" Paris", " Rome"]}
    )
    assert choice.choices[0].text in (" Paris", " Rome")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    newer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
        extra_body={"structured_outputs": {"json": schema}},
    )  # fmt: skip
    jsonschema.validate(json.loads(newer.choices[0].text), schema)


def test_what_cannot_be_served_is_a_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as yaml:
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            response_format={"type": "yaml"},  # type: ignore[arg-type,typeddict-item]
        )
    assert "'yaml'" in yaml.value.message
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "strin"}}}
    with pytest.raises(openai.BadRequestError) as schema:
        client.chat.completions.create(model=MODEL, messages=QUESTION, response_format=bad)  # type: ignore[arg-type]
    assert 'Unsupported type "strin"' in schema.value.message
    with pytest.raises(openai.BadRequestError) as stream:  # before the stream starts
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, stream=True, extra_body={"guided_regex": "a("}
        )
    assert "regex cannot be compiled" in stream.value.message
    after = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert after.choices[0].finish_reason in ("stop", "length")  # the server is fine


def test_responses_text_format_through_create_and_parse(client: openai.OpenAI) -> None:
    """The Responses API's ``text.format`` takes the same grammars as ``response_format``."""
    parsed = client.responses.parse(
        model=MODEL, input=QUESTION[0]["content"], text_format=Capital, temperature=0,
        max_output_tokens=80,
    )  # fmt: skip
    assert isinstance(parsed.output_parsed, Capital) and "Paris" in parsed.output_parsed.city
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt: Any = {"type": "json_schema", "name": "ok", "schema": schema, "strict": True}
    created = client.responses.create(
        model=MODEL, input="Is Paris in France?", text={"format": fmt}, temperature=0,
        max_output_tokens=40,
    )  # fmt: skip
    jsonschema.validate(json.loads(created.output_text), schema)
    loose = client.responses.create(
        model=MODEL, input="Describe Paris in JSON.", text={"format": {"type": "json_object"}},
        temperature=0, max_output_tokens=40,
    )  # fmt: skip
    assert loose.output_text.startswith("{")  # any object; 40 tokens may cut it short
    if loose.status == "completed":
        assert isinstance(json.loads(loose.output_text), dict)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(
            model=MODEL, input="x", text={"format": {"type": "json_schema", "name": "b"}}
        )
    assert bad.value.param == "text.format.schema"


TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}},
                "required": ["city"],
            },
        },
    },
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER_QUESTION: Any = [{"role": "user", "content": "What will the weather be in Paris?"}]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_of_smollm2_validate(
    client: openai.OpenAI, choice: Any, stream: bool
) -> None:
    kwargs: Any = {"model": MODEL, "messages": WEATHER_QUESTION, "tools": TOOLS}
    kwargs |= {"tool_choice": choice, "temperature": 0, "max_tokens": 120}
    if not stream:
        reply = client.chat.completions.create(**kwargs)
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = [
            (c.function.name, c.function.arguments)
            for c in reply.choices[0].message.tool_calls or []
        ]  # type: ignore[union-attr]
    else:
        named: dict[int, list[str]] = {}
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            for piece in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                entry = named.setdefault(piece.index, ["", ""])
                entry[0] += piece.function.name or ""  # type: ignore[union-attr]
                entry[1] += piece.function.arguments or ""  # type: ignore[union-attr]
        calls = [(name, arguments) for name, arguments in named.values()]
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), TOOL_SCHEMAS[name])
    if isinstance(choice, dict):
        assert [name for name, _ in calls] == ["get_weather"]


def test_an_echo_engine_refuses_structured_outputs(echo_server: str) -> None:
    echo = openai.OpenAI(base_url=f"{echo_server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        echo.chat.completions.create(
            model="tiny", messages=QUESTION, response_format={"type": "json_object"}
        )
    assert "out=echo" in refused.value.message
    assert refused.value.code == "structured_output_unsupported"
    plain = echo.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=3)
    assert plain.choices[0].message.content
