"""Schemathesis against the live server's ``/openapi.json``: bad input never gets a 5xx.

Design decisions:

- The server is a real ``dynask run out=echo`` process (one worker, the tiny model's
  tokenizer; the session's ``echo_server``): the echo engine answers at once, so the HTTP
  layer is what is fuzzed.
- Every operation of the served document is exercised with schema-valid and schema-invalid
  inputs. Checks: no 5xx, the status, content type and body match what is declared, and
  every error body has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
- The fuzzer's copy of the document pins ``model`` to the served name and keeps replies
  short, so valid requests reach the engine instead of stopping at a 404.
- Bounded and derandomized, so CI sees the same examples on every run.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.failures import Failure
from schemathesis.core.transport import Response
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.schemas import OpenApiSchema

from dynask.control_plane.api.app import build_app
from dynask.control_plane.api.engines_routes import make_engines_routes
from dynask.control_plane.api.openapi_document import openapi_document
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService

MODEL = "tiny"
MAX_EXAMPLES = 50


@pytest.fixture(scope="module")
def served_schema(echo_server: str) -> OpenApiSchema:
    document = httpx.get(f"{echo_server}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(_short_replies(document))
    schema.config.update(base_url=echo_server, request_timeout=30)
    return schema


def _short_replies(document: dict[str, Any]) -> dict[str, Any]:
    """The document with the served model's name, small token budgets and token ids."""
    document = copy.deepcopy(document)
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        properties = body["schema"]["properties"]
        properties["model"] = {"type": "string", "enum": [MODEL]}
        for name in ("max_tokens", "max_completion_tokens"):
            properties[name] = {**properties[name], "maximum": 8}
    prompt = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]
    token_ids = prompt["application/json"]["schema"]["properties"]["prompt"]["oneOf"][1]
    token_ids["items"]["maximum"] = 1000  # inside the tiny model's vocabulary
    return document


def _anthropic_error_shape(response: Response, case: Case) -> None:
    """The Messages API answers in Anthropic's shape: ``{"type": "error", "error": {"type",
    "message"}}``."""
    try:
        body = response.json()
        ok = body["type"] == "error" and isinstance(body["error"]["message"], str)
        ok = ok and isinstance(body["error"]["type"], str)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise Failure(
            operation=case.operation.label,
            title="Error body is not Anthropic-shaped",
            message=f"{response.status_code}: {response.text[:300]!r}",
        )


def openai_error_shape(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx/5xx body is ``{"error": {"message", "type", "param", "code"}}``."""
    if response.status_code < 400:
        return None
    if case.operation.path.startswith("/v1/messages"):
        return _anthropic_error_shape(response, case)
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Failure(
            operation=case.operation.label,
            title="Error body is not OpenAI-shaped",
            message=f"{response.status_code}: {response.text[:300]!r} ({exc!r})",
        ) from None
    keys = sorted(error) if isinstance(error, dict) else None
    if keys != ["code", "message", "param", "type"] or not isinstance(error["message"], str):
        raise Failure(
            operation=case.operation.label,
            title="Error body is not OpenAI-shaped",
            message=f"{response.status_code}: {response.text[:300]!r}",
        )
    return None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    openai_error_shape,
]


async def _no_refresh() -> None:
    return None


def _api_routes() -> list[Any]:
    """The routes of the API as ``dynask run`` serves them (the admin UI aside)."""
    service = ServingService(ServingMetrics())
    return build_app(service, extra_routes=[*make_engines_routes(service, _no_refresh)]).routes


def _operations() -> list[tuple[str, str, GenerationMode]]:
    """Every (path, method) of the generated document; negative inputs where it takes any."""
    cases = []
    for path, item in openapi_document(_api_routes())["paths"].items():
        for method, operation in item.items():
            cases.append((path, method, GenerationMode.POSITIVE))
            if "parameters" in operation or "requestBody" in operation:
                cases.append((path, method, GenerationMode.NEGATIVE))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize(("path", "method", "mode"), _operations())
def test_no_operation_answers_5xx_or_off_schema(
    served_schema: OpenApiSchema, path: str, method: str, mode: GenerationMode
) -> None:
    operation = served_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call_and_validate(case: Case) -> None:
        case.call_and_validate(checks=CHECKS)

    call_and_validate()


# ---- hostile strings in every string field -----------------------------------------------------

HOSTILE = st.one_of(
    st.sampled_from(
        ["\ud800", "a\udfffb", "\ud83d", "\x00", "nul\x00inside", "\u2028\u2029", "\ufeff"]
    ),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=8),  # lone surrogates
    st.text(st.characters(exclude_categories=[]), min_size=1, max_size=50),  # any code point
    st.tuples(st.sampled_from(["x", "\x00", "\ud800"]), st.integers(1, 3)),  # huge: built
)  # in the test from (character, MiB), so hypothesis never prints a megabyte


def _hostile(value: str | tuple[str, int]) -> str:
    if isinstance(value, tuple):
        character, mib = value
        return character * (mib * 2**20 // 6)  # a NUL or surrogate is 6 bytes of JSON
    return value


NESTED_DEPTHS = st.integers(10, 100_000)
CHAT_BODY: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ],
    "max_tokens": 2,
    "stop": ["zz"],
    "user": "u",
    "router_mode": "kv",
}
COMPLETION_BODY: dict[str, Any] = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "stop": "zz"}


def _string_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where ``value`` holds strings, keys included (as ``("key", name)``)."""
    if isinstance(value, str):
        return [path]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _string_paths(item, (*path, i))]
    if isinstance(value, dict):
        keys = [(*path, ("key", k)) for k in value]
        return keys + [p for k, item in value.items() for p in _string_paths(item, (*path, k))]
    return []


def _replaced(body: Any, path: tuple[Any, ...], new: Any) -> Any:
    body = copy.deepcopy(body)
    *parents, last = path
    target = body
    for step in parents:
        target = target[step]
    if isinstance(last, tuple):  # a key: rename it
        target[new if isinstance(new, str) else str(new)] = target.pop(last[1])
    else:
        target[last] = new
    return body


def _fields() -> list[tuple[str, tuple[Any, ...]]]:
    return [
        (route, path)
        for route, body in (
            ("/v1/chat/completions", CHAT_BODY),
            ("/v1/completions", COMPLETION_BODY),
        )
        for path in _string_paths(body)
    ]


def _answer_is_a_clean_4xx(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert sorted(error) == ["code", "message", "param", "type"], error
        assert len(response.content) < 10_000  # a huge value is quoted cut, not whole


@pytest.mark.slow
@pytest.mark.parametrize(("route", "path"), _fields(), ids=str)
def test_hostile_strings_never_get_a_5xx(
    echo_server: str, route: str, path: tuple[Any, ...]
) -> None:
    base = CHAT_BODY if route == "/v1/chat/completions" else COMPLETION_BODY
    with httpx.Client(base_url=echo_server, timeout=60) as client:  # pooled: a 5xx that
        # closed the connection would also break the next example's request

        @given(value=HOSTILE, stream=st.booleans())
        @settings(
            max_examples=12,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def send(value: str | tuple[str, int], stream: bool) -> None:
            body = {**_replaced(base, path, _hostile(value)), "stream": stream}
            content = json.dumps(body).encode()
            if len(content) > 4 * 2**20:
                content = content[: 4 * 2**20 - 2] + b"}"  # still over-limit: a 413
            headers = {"content-type": "application/json"}
            _answer_is_a_clean_4xx(client.post(route, content=content, headers=headers))

        send()


@pytest.mark.slow
def test_deeply_nested_values_never_get_a_5xx(echo_server: str) -> None:
    with httpx.Client(base_url=echo_server, timeout=60) as client:

        @given(depth=NESTED_DEPTHS, where=st.sampled_from(["prompt", "stop", "user", "x"]))
        @settings(max_examples=20, deadline=None, derandomize=True, database=None)
        def send(depth: int, where: str) -> None:
            nested = "[" * depth + "]" * depth
            body = {k: v for k, v in COMPLETION_BODY.items() if k != where}
            text = json.dumps(body)[:-1] + f', "{where}": ' + nested + "}"
            headers = {"content-type": "application/json"}
            response = client.post("/v1/completions", content=text, headers=headers)
            _answer_is_a_clean_4xx(response)
            assert response.status_code in (400, 413)

        send()
