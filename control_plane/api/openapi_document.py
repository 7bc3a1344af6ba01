"""The OpenAPI 3.1 document, generated from the app's own routes and request fields.

Each HTTP route of the API is an ``ApiRoute``: a Starlette ``Route`` that carries its
``Operation`` (summary, request body or query fields, answers). ``openapi_document``
walks the app's routes, so a served route cannot be missing from the document, and the
request bodies are the same ``request_fields`` declarations the validator reads. A route
that is no part of the API (the admin UI's redirect) says so with
``include_in_schema=False``; a ``Mount`` (the admin UI) is not described. Any other
plain ``Route`` is an error: ``undocumented_routes`` names them, and a test keeps the list
empty.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import BaseRoute, Route

from dynask.control_plane.api.request_fields import Field, Schema, body_schema

BEARER = "bearerAuth"
VERSION = "0.1.0"

_ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
}


@dataclass(frozen=True)
class Operation:
    """What the document says about one route: ``answers`` are described only, ``errors``
    carry OpenAI's error body; ``body`` (a JSON request body) and ``query`` are fields."""

    summary: str
    answers: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)
    body: tuple[Field, ...] = ()
    required: tuple[str, ...] = ()  # of the body
    query: tuple[Field, ...] = ()


class ApiRoute(Route):
    """A ``Route`` with its ``Operation``."""

    def __init__(
        self,
        path: str,
        endpoint: Callable[..., Any],
        *,
        methods: Sequence[str],
        operation: Operation,
    ) -> None:
        super().__init__(path, endpoint, methods=list(methods))
        self.operation = operation


def openapi_document(routes: Iterable[BaseRoute], api_key_required: bool = False) -> Schema:
    """The document of ``routes``; ``/v1`` operations carry the bearer scheme (required
    when ``api_key_required``, else optional) and, when required, a 401 answer."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if isinstance(route, ApiRoute):
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    paths.setdefault(route.path, {})[method.lower()] = _operation(
                        route.path, route.operation, api_key_required
                    )
    return {
        "openapi": "3.1.0",
        "info": {"title": "dynask", "version": VERSION},
        "paths": paths,
        "components": {
            "securitySchemes": {
                BEARER: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key (`dynask keys create NAME`); required on /v1 "
                    "when the server runs with --require-api-key",
                }
            }
        },
    }


def undocumented_routes(routes: Iterable[BaseRoute]) -> list[str]:
    """The plain routes that are neither ``ApiRoute``s nor marked out of the schema."""
    return [
        route.path
        for route in routes
        if isinstance(route, Route) and not isinstance(route, ApiRoute) and route.include_in_schema
    ]


def _operation(path: str, operation: Operation, api_key_required: bool) -> Schema:
    errors = dict(operation.errors)
    result: Schema = {"summary": operation.summary}
    if path.startswith("/v1"):
        result["security"] = [{BEARER: []}] if api_key_required else [{}, {BEARER: []}]
        if api_key_required:
            errors["401"] = "missing or invalid API key"
    if operation.query:
        result["parameters"] = [
            {"name": f.name, "in": "query", "required": False, "schema": f.document()}
            for f in operation.query
        ]
    if operation.body:
        schema = body_schema(operation.body, operation.required)
        result["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    described = {status: {"description": text} for status, text in operation.answers.items()}
    result["responses"] = {**described, **_errors(errors)}
    return result


def _errors(statuses: dict[str, str]) -> dict[str, Any]:
    return {
        status: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
        for status, text in statuses.items()
    }


GENERATION_ERRORS = {
    "400": "invalid request: the message names the parameter",
    "404": "unknown model",
    "413": "request body too large",
    "429": "the tenant (API key, else user) is over one of its limits (Retry-After)",
    "503": "no engine ready, or every engine overloaded (Retry-After)",
}
