"""Schemathesis against the live server's ``/openapi.json``: bad input never gets a 5xx.

Design decisions:

- The server is a real ``dynask run out=echo`` process (one worker, the tiny model's
  tokenizer): the echo engine answers at once, so the HTTP layer is what is fuzzed.
- Every operation of the served document is exercised with schema-valid and schema-invalid
  inputs. Checks: no 5xx, the status, content type and body match what is declared, and
  every error body has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
- The fuzzer's copy of the document pins ``model`` to the served name and keeps replies
  short, so valid requests reach the engine instead of stopping at a 404.
- Bounded and derandomized, so CI sees the same examples on every run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
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

# Imported here, at collection, not lazily inside the fixture: pytest rewrites schemathesis'
# modules (a pytest plugin) as they are imported, and a rewrite deep in a test's stack hit
# CPython 3.11's "AST constructor recursion depth mismatch".
from schemathesis.specs.openapi.schemas import OpenApiSchema

from dynask.control_plane.api.openapi_document import openapi_document
from tests.control_plane import server_process as sp

MODEL = "tiny"
MAX_EXAMPLES = 50


@pytest.fixture(scope="module")
def echo_server(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("fuzz-server")
    args = [str(tiny_llama_folder), "out=echo", "--model-name", MODEL, "--workers", "1"]
    with sp.dynask_run(folder, args) as (base, _):
        yield base


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


def openai_error_shape(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx/5xx body is ``{"error": {"message", "type", "param", "code"}}``."""
    if response.status_code < 400:
        return None
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


def _operations() -> list[tuple[str, str, GenerationMode]]:
    """Every (path, method) of the served document; negative inputs where it takes any."""
    cases = []
    for path, item in openapi_document()["paths"].items():
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
