"""The structured-output request fields: what each becomes, and each refusal by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.structured_output import StructuredOutput
from dynask.control_plane.api.errors import APIError
from dynask.control_plane.api.request_schema import parse_chat, parse_completion
from dynask.control_plane.serving.errors import InvalidRequestError
from dynask.control_plane.serving.structured_output_support import refuse_unless_served

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def structured(**fields: Any) -> dict[str, Any] | None:
    sampling = parse_chat({**CHAT, **fields}).sampling
    return sampling.get("structured_output")


def refusal(**fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_chat({**CHAT, **fields})
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, {"kind": "json_object", "spec": ""}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },
            {"kind": "json_schema", "spec": json.dumps(SCHEMA)},
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                }
            },
            {"kind": "json_schema", "spec": json.dumps(SCHEMA)},
        ),
        ({"guided_json": SCHEMA}, {"kind": "json_schema", "spec": json.dumps(SCHEMA)}),
        ({"guided_json": json.dumps(SCHEMA)}, {"kind": "json_schema", "spec": json.dumps(SCHEMA)}),
        ({"guided_regex": "[a-z]+"}, {"kind": "regex", "spec": "[a-z]+"}),
        ({"guided_choice": ["yes", "no"]}, {"kind": "choice", "spec": '["yes", "no"]'}),
        ({"guided_grammar": 'root ::= "a"'}, {"kind": "grammar", "spec": 'root ::= "a"'}),
        (
            {"structured_outputs": {"json": SCHEMA}},
            {"kind": "json_schema", "spec": json.dumps(SCHEMA)},
        ),
        ({"structured_outputs": {"regex": "x+"}}, {"kind": "regex", "spec": "x+"}),
        ({"structured_outputs": {"choice": ["é"]}}, {"kind": "choice", "spec": '["é"]'}),
        ({"structured_outputs": {"json_object": True}}, {"kind": "json_object", "spec": ""}),
        (
            {"structured_outputs": {"grammar": 'start: "a"', "disable_any_whitespace": True}},
            {"kind": "grammar", "spec": 'start: "a"'},
        ),
    ],
)
def test_each_form_becomes_one_spec(
    fields: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    assert structured(**fields) == expected


def test_the_schema_keeps_its_property_order() -> None:
    wire = structured(guided_json=SCHEMA)
    assert wire is not None
    assert list(json.loads(wire["spec"])["properties"]) == ["b", "a"]


def test_completions_take_the_same_fields() -> None:
    body = {"model": "m", "prompt": "x", "guided_regex": "[0-9]"}
    assert parse_completion(body).sampling["structured_output"] == {
        "kind": "regex",
        "spec": "[0-9]",
    }


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"response_format": {"type": "yaml"}}, "response_format", "type 'yaml'"),
        ({"response_format": "json"}, "response_format", "an object with a 'type'"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "'schema'"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
            "response_format.json_schema.schema",
            "a JSON schema (an object)",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "strin"}},
                }
            },
            "response_format",
            'JSON schema cannot be compiled: Unsupported type "strin"',
        ),
        (
            {"guided_json": {"type": "integer", "minimum": 5, "maximum": 2}},
            "guided_json",
            "minimum greater than maximum",
        ),
        ({"guided_json": "{not json"}, "guided_json", "is a string but not JSON"),
        ({"guided_regex": "a(b"}, "guided_regex", "The parenthesis is not closed"),
        ({"guided_regex": ""}, "guided_regex", "non-empty string"),
        ({"guided_choice": []}, "guided_choice", "non-empty array"),
        ({"guided_choice": ["a", 1]}, "guided_choice", "non-empty array"),
        ({"guided_grammar": "root ::= foo"}, "guided_grammar", 'Rule "foo" is not defined'),
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend", "not supported"),
        ({"structured_outputs": {}}, "structured_outputs", "exactly one of"),
        (
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs",
            "it sets regex, choice",
        ),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
            "not supported",
        ),
        (
            {"structured_outputs": {"structural_tag": "{}"}},
            "structured_outputs.structural_tag",
            "not supported",
        ),
        (
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": False}},
            "structured_outputs.disable_any_whitespace",
            "can only be true",
        ),
        (
            {"guided_regex": "a", "response_format": {"type": "json_object"}},
            "guided_regex",
            "'response_format' and 'guided_regex' both constrain the output",
        ),
    ],
)
def test_refusals_name_the_field_and_the_problem(
    fields: dict[str, Any], param: str, words: str
) -> None:
    error = refusal(**fields)
    assert error.param == param
    assert words in error.message


def test_engines_that_cannot_follow_a_grammar_are_refused() -> None:
    refuse_unless_served(["torch", "vllm"])
    with pytest.raises(InvalidRequestError) as caught:
        refuse_unless_served(["torch", "mocker", "echo"])
    assert "out=echo, out=mocker" in caught.value.message
    assert caught.value.code == "structured_output_unsupported"


def test_the_spec_crosses_a_wire_as_a_dict_and_back() -> None:
    wire = structured(guided_choice=["a", "b"])
    params = SamplingParams(max_tokens=4, structured_output=wire)  # type: ignore[arg-type]
    assert params.structured_output == StructuredOutput("choice", '["a", "b"]')
    assert params.structured_output.choices() == ["a", "b"]


def test_a_continuation_replays_what_was_generated() -> None:
    spec = StructuredOutput("regex", "a+")
    once = spec.resumed_after(3)
    assert once == StructuredOutput("regex", "a+", resumed_tokens=3)
    assert once.to_wire() == {"kind": "regex", "spec": "a+", "resumed_tokens": 3}
    assert once.resumed_after(2).resumed_tokens == 5  # a second move adds its tokens
    assert once.key == spec.key  # the same compiled grammar
