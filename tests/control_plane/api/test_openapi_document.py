"""The generated OpenAPI document: every served route is in it, and its request bodies are
the validator's own declarations (no running cluster: the wired app's routes suffice)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Mount, Route

from dynask.control_plane.api.errors import APIError
from dynask.control_plane.api.openapi_document import BEARER, openapi_document, undocumented_routes
from dynask.control_plane.api.request_fields import Integer, Number
from dynask.control_plane.api.request_schema import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    parse_chat,
    parse_completion,
)
from dynask.control_plane.server import ControlPlane, ServerOptions
from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.web.mount import admin_extension

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.fixture
def control_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    """The wired control plane of ``dynask run out=echo`` with the admin UI, not started."""
    monkeypatch.setenv("DYNASK_ADMIN_PASSWORD", "not-a-secret-password")
    plan = DeploymentSpec("default", engine="echo", served_model_name="m")
    options = ServerOptions(database_url=f"sqlite:///{tmp_path / 'state.db'}")
    yield ControlPlane([plan], options, [lambda cp: admin_extension(cp, console=io.StringIO())])


def _served(routes: list[Any]) -> set[tuple[str, str]]:
    return {
        (route.path, method.lower())
        for route in routes
        if isinstance(route, Route) and route.include_in_schema
        for method in route.methods or ()
        if method != "HEAD"
    }


def test_every_served_route_is_in_the_document(control_plane: ControlPlane) -> None:
    routes = control_plane.app.routes
    document = openapi_document(routes)
    documented = {(path, method) for path, item in document["paths"].items() for method in item}

    assert undocumented_routes(routes) == []
    assert _served(routes) == documented
    assert ("/v1/engines", "get") in documented
    assert [r.path for r in routes if isinstance(r, Mount)] == ["/admin"]  # HTML, not the API


def test_the_bearer_scheme_is_optional_unless_keys_are_required(
    control_plane: ControlPlane,
) -> None:
    optional = openapi_document(control_plane.app.routes)
    required = openapi_document(control_plane.app.routes, api_key_required=True)

    assert optional["components"]["securitySchemes"][BEARER]["scheme"] == "bearer"
    chat = "/v1/chat/completions"
    assert optional["paths"][chat]["post"]["security"] == [{}, {BEARER: []}]
    assert required["paths"][chat]["post"]["security"] == [{BEARER: []}]
    assert "401" in required["paths"][chat]["post"]["responses"]
    assert "401" not in optional["paths"][chat]["post"]["responses"]
    assert "security" not in required["paths"]["/health"]["get"]


def test_request_bodies_are_the_declared_fields(control_plane: ControlPlane) -> None:
    paths = openapi_document(control_plane.app.routes)["paths"]
    for path, fields in (
        ("/v1/chat/completions", CHAT_FIELDS),
        ("/v1/completions", COMPLETION_FIELDS),
    ):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert list(schema["properties"]) == [f.name for f in fields]
        assert schema["additionalProperties"] is False
        assert all(schema["properties"][f.name]["description"] == f.description for f in fields)
    chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat["schema"]["properties"]["temperature"] == {
        "type": "number",
        "minimum": 0.0,
        "maximum": 2.0,
        "description": "sampling temperature; 0 is greedy",
    }


@pytest.mark.parametrize("field", [f for f in CHAT_FIELDS if isinstance(f, (Integer, Number))])
def test_the_validator_takes_exactly_the_documented_range(field: Integer | Number) -> None:
    """At each documented bound the value passes; one step beyond it is a 400 naming it."""
    schema = field.schema()
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    step = 1 if isinstance(field, Integer) else 0.5
    # top_logprobs needs logprobs: true; parsing alone does not ask the engine, so all may.
    body = {**CHAT, "logprobs": True}
    inside = low + step if "exclusiveMinimum" in schema else low
    parse_chat({**body, field.name: inside})
    with pytest.raises(APIError) as below:
        parse_chat({**body, field.name: low - step if "minimum" in schema else low})
    assert below.value.param == field.name
    if "maximum" in schema:
        parse_chat({**body, field.name: schema["maximum"]})
        with pytest.raises(APIError) as above:
            parse_chat({**body, field.name: schema["maximum"] + step})
        assert above.value.param == field.name


def test_an_undeclared_parameter_is_refused_by_name() -> None:
    for parse, body in ((parse_chat, CHAT), (parse_completion, COMPLETION)):
        with pytest.raises(APIError) as raised:
            parse({**body, "typical_p": 0.9})
        assert (raised.value.param, raised.value.code) == ("typical_p", "unknown_parameter")
        assert "Unrecognized request argument supplied: 'typical_p'" in raised.value.message


# OpenAI's request parameters (API reference, chat/completions and completions, late 2025).
OPENAI_CHAT = [
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
]
OPENAI_COMPLETIONS = [
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
]


@pytest.mark.parametrize(
    ("fields", "openai_names"),
    [(CHAT_FIELDS, OPENAI_CHAT), (COMPLETION_FIELDS, OPENAI_COMPLETIONS)],
    ids=["chat", "completions"],
)
def test_every_openai_parameter_is_declared(fields: Any, openai_names: list[str]) -> None:
    """Served, accepted or refused by name with its own message: none is left to the
    generic 'unrecognized' answer, and none is dropped."""
    assert sorted(set(openai_names) - {f.name for f in fields}) == []
