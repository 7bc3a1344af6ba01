"""The request fields that ask for structured outputs, validated into one grammar spec.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema`` strict or not),
vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
and its newer ``structured_outputs`` object all become one ``StructuredOutput``; a
request may use one of them. The grammar is built here, so one that cannot compile is a
400 naming the field and xgrammar's reason before the request reaches an engine (the
engine compiles it again against its tokenizer, from its own cache). Anything these
fields carry that dynask does not serve is refused by name.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from dynask.actors.api.structured_output import GrammarError, StructuredOutput, build_grammar
from dynask.control_plane.api.errors import invalid

_RESPONSE_FORMATS = ("text", "json_object", "json_schema")
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# Options that only say what dynask does anyway: accepted at that value, refused otherwise.
_FIXED_OPTIONS = {"disable_any_whitespace": True, "disable_additional_properties": True}


def parse_structured_output(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's grammar spec as it travels (``StructuredOutput.to_wire``), or None."""
    _refuse_unserved(body)
    found = [
        (name, output)
        for name, output in (
            ("response_format", _response_format(body.get("response_format"))),
            *((name, _guided(name, body.get(name))) for name in _GUIDED),
            ("structured_outputs", _structured_outputs(body.get("structured_outputs"))),
        )
        if output is not None
    ]
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(f"'{name}'" for name, _ in found)
        raise invalid(found[1][0], f"{names} both constrain the output; send only one of them")
    name, output = found[0]
    problem = grammar_problem(output.kind, output.spec)
    if problem is not None:
        raise invalid(name, f"'{name}': {problem}")
    return output.to_wire()


@functools.lru_cache(maxsize=256)
def grammar_problem(kind: str, spec: str) -> str | None:
    """Why the grammar cannot compile, or None. Cached: building the grammar of a
    typical schema takes milliseconds, and clients send the same schema again and again."""
    try:
        build_grammar(StructuredOutput(kind, spec))
    except GrammarError as exc:
        return str(exc)
    return None


def _refuse_unserved(body: dict[str, Any]) -> None:
    for name in ("guided_whitespace_pattern", "guided_decoding_backend"):
        if body.get(name) is not None:
            raise invalid(
                name,
                f"'{name}' is not supported by dynask (it always uses xgrammar and generates "
                "compact JSON); leave it out",
            )


def _response_format(value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise invalid("response_format", "'response_format' must be an object with a 'type'")
    kind = value["type"]
    if kind not in _RESPONSE_FORMATS:
        raise invalid(
            "response_format",
            f"'response_format' has type {kind!r}, which dynask does not serve; use one of "
            f"{', '.join(_RESPONSE_FORMATS)}",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise invalid(where, f"'{where}' must be an object with 'name' and 'schema'")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(
            f"{where}.strict", f"'{where}.strict' has value {strict!r}; expected true or false"
        )
    return StructuredOutput("json_schema", _schema_text(f"{where}.schema", spec.get("schema")))


def _guided(name: str, value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    if name == "guided_json":
        return StructuredOutput("json_schema", _schema_text(name, value))
    if name == "guided_choice":
        return StructuredOutput("choice", _choices(name, value))
    return StructuredOutput("regex" if name == "guided_regex" else "grammar", _text(name, value))


def _structured_outputs(value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    name = "structured_outputs"
    if not isinstance(value, dict):
        raise invalid(
            name, f"'{name}' must be an object (json, regex, choice, grammar or json_object)"
        )
    for option, served in _FIXED_OPTIONS.items():
        if value.get(option) not in (None, served):
            raise invalid(
                f"{name}.{option}",
                f"'{name}.{option}' can only be {json.dumps(served)} in dynask; leave it out",
            )
    for option in ("whitespace_pattern", "structural_tag"):
        if value.get(option) is not None:
            raise invalid(f"{name}.{option}", f"'{name}.{option}' is not supported by dynask")
    given = [kind for kind in _STRUCTURED_KINDS if value.get(kind) not in (None, False)]
    if len(given) != 1:
        raise invalid(
            name,
            f"'{name}' must set exactly one of {', '.join(_STRUCTURED_KINDS)}; it sets "
            f"{', '.join(given) or 'none'}",
        )
    kind, where = given[0], f"{name}.{given[0]}"
    spec = value[kind]
    if kind == "json":
        return StructuredOutput("json_schema", _schema_text(where, spec))
    if kind == "json_object":
        if spec is not True:
            raise invalid(where, f"'{where}' has value {spec!r}; expected true")
        return StructuredOutput("json_object")
    if kind == "choice":
        return StructuredOutput("choice", _choices(where, spec))
    return StructuredOutput(kind, _text(where, spec))


def _schema_text(where: str, schema: Any) -> str:
    """A JSON schema (an object, or its JSON text) as JSON text, property order kept."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise invalid(where, f"'{where}' is a string but not JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise invalid(where, f"'{where}' must be a JSON schema (an object)")
    return json.dumps(schema, ensure_ascii=False)


def _choices(where: str, value: Any) -> str:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(choice, str) and choice for choice in value)
    ):
        raise invalid(where, f"'{where}' must be a non-empty array of non-empty strings")
    return json.dumps(value, ensure_ascii=False)


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(where, f"'{where}' must be a non-empty string")
    return value
