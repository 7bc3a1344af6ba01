"""Tool calls held to their functions' schemas by the grammar (``tools.tool_grammar``).

The prompt is rendered as the chat API renders it (``plan_chat``: the tiny models carry
SmolLM2's template, which has no tools, so dynask's Hermes format), the built-in engine
generates under the plan's grammar, and the plan's parser reads the calls. The tiny
random models pick tokens at random: a call whose arguments validate does so because of
the grammar, never by chance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.structured_output import StructuredOutput
from dynask.actors.engine.engine import LLMEngine
from dynask.control_plane.api.chat_output import ChatOptions, ChatPlan, plan_chat
from dynask.control_plane.api.tools.formats import FORMATS
from dynask.control_plane.api.tools.tool_grammar import tool_grammar
from dynask.control_plane.api.tools.tool_request import ToolRequest, parse_tool_request
from tests.actors.engine.helpers import make_engine

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "units"],
}
CLOCK_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["zone"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "now", "parameters": CLOCK_PARAMETERS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "now": CLOCK_PARAMETERS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "now"}}


def tools_of(choice: Any, parallel: bool = True) -> ToolRequest:
    tools = parse_tool_request(
        {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel}
    )
    assert tools is not None
    return tools


def test_the_grammar_of_each_choice_and_format() -> None:
    hermes, mistral = FORMATS["hermes"], FORMATS["mistral"]
    assert tool_grammar(tools_of("none"), hermes, False, False) is None
    for choice in ("auto", "required", NAMED):
        grammar = tool_grammar(tools_of(choice), hermes, False, False)
        assert grammar is not None and grammar["kind"] == "structural_tag"
    # Without a structural tag for the format: bare JSON when forced, nothing under auto.
    assert tool_grammar(tools_of("auto"), mistral, False, False) is None
    named = tool_grammar(tools_of(NAMED), mistral, False, False)
    assert named == {"kind": "json_schema", "spec": json.dumps(CLOCK_PARAMETERS)}
    required = tool_grammar(tools_of("required", parallel=False), mistral, False, False)
    assert required is not None and json.loads(required["spec"])["maxItems"] == 1


def test_a_bad_parameters_schema_is_a_400_naming_tools(tiny_llama_folder: Path) -> None:
    from transformers import AutoTokenizer

    from dynask.control_plane.api.errors import APIError

    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]
    tools = parse_tool_request({"tools": bad, "tool_choice": "required"})
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_folder)
    with pytest.raises(APIError) as raised:
        plan_chat(tokenizer, ASK, tools, ChatOptions(), "m", {"torch"})
    assert raised.value.param == "tools"


def test_no_grammar_for_an_engine_that_cannot_follow_one(tiny_llama_folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_folder)
    _, plan = plan_chat(tokenizer, ASK, tools_of("required"), ChatOptions(), "m", {"python"})
    assert plan.tool_grammar is None and "structured_output" not in plan.sampling


@pytest.fixture(scope="module", params=["tiny_llama_folder", "tiny_qwen3_folder"])
def engine(request: pytest.FixtureRequest) -> LLMEngine:
    folder: Path = request.getfixturevalue(request.param)
    return make_engine(folder, block_size=8)


def _plan(engine: LLMEngine, tools: ToolRequest) -> tuple[list[int], ChatPlan]:
    text, plan = plan_chat(engine.tokenizer, ASK, tools, ChatOptions(), "m", {"torch"})
    ids = [int(t) for t in engine.tokenizer.encode(text, add_special_tokens=False)]
    return ids, plan


def _calls(plan: ChatPlan, text: str) -> list[tuple[str, Any]]:
    parser = plan.parser()
    for at in range(0, len(text), 3):  # in pieces, as a stream arrives
        parser.feed(text[at : at + 3])
    parser.finish()
    return [(call.name, json.loads(call.arguments)) for call in parser.calls]


@pytest.mark.parametrize(
    ("choice", "parallel"), [("required", False), ("required", True), (NAMED, True)]
)
def test_forced_calls_validate_against_their_schemas(
    engine: LLMEngine, choice: Any, parallel: bool
) -> None:
    ids, plan = _plan(engine, tools_of(choice, parallel))
    spec = StructuredOutput.from_wire(plan.sampling["structured_output"])
    for seed in (1, 2, 3):
        params = SamplingParams(max_tokens=160, temperature=1.0, seed=seed, structured_output=spec)
        [output] = engine.generate([ids], params)
        calls = _calls(plan, output.text)
        assert calls, output.text
        if choice == NAMED or not parallel:
            assert len(calls) == 1 and output.finish_reason == "stop", output.text
        if choice == NAMED:
            assert calls[0][0] == "now"
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])


def test_under_auto_an_opened_call_gets_valid_arguments(engine: LLMEngine) -> None:
    """The model opens a call: the prompt ends with ``<tool_call>`` generated under the
    grammar (``resumed_tokens``, as a migrated request arrives), so the matcher is where
    a model that wrote the opening tag would have it."""
    ids, plan = _plan(engine, tools_of("auto", parallel=False))
    assert "structured_output" not in plan.sampling and plan.tool_grammar is not None
    opened = [int(t) for t in engine.tokenizer.encode("<tool_call>", add_special_tokens=False)]
    grammar = StructuredOutput.from_wire(plan.tool_grammar)
    assert grammar is not None
    spec = grammar.resumed_after(len(opened))
    for seed in (1, 2, 3):
        params = SamplingParams(max_tokens=160, temperature=1.0, seed=seed, structured_output=spec)
        [output] = engine.generate([ids + opened], params)
        [(name, arguments)] = _calls(plan, "<tool_call>" + output.text)
        jsonschema.validate(arguments, SCHEMAS[name])
        assert output.finish_reason == "stop"  # one call only: then the end


def test_under_auto_text_without_a_call_stays_free(engine: LLMEngine) -> None:
    ids, plan = _plan(engine, tools_of("auto"))
    grammar = StructuredOutput.from_wire(plan.tool_grammar)
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    held = SamplingParams(
        max_tokens=24, temperature=0.0, ignore_eos=True, structured_output=grammar
    )
    [alone] = engine.generate([ids], free)
    [constrained] = engine.generate([ids], held)
    assert "<tool_call>" not in alone.text and "<think>" not in alone.text
    assert constrained.token_ids == alone.token_ids  # the grammar allowed every token
