"""A hand-written OpenAPI 3.1 document for the endpoints we serve."""

from __future__ import annotations

from typing import Any

from dynask.control_plane.api.request_schema import INT64_MAX, INT64_MIN, ROLES
from dynask.control_plane.routing.kv_router import ROUTING_MODES

_ERROR = {
    "type": "object",
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

_SAMPLING = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": INT64_MAX},
    "seed": {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX},
    "stop": {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
        ]
    },
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "n": {"type": "integer", "enum": [1]},
    "ignore_eos": {"type": "boolean"},
    "router_mode": {"type": "string", "enum": list(ROUTING_MODES)},
}


_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}


def _post(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {"description": "JSON, or an SSE stream when stream=true"},
                **_errors(
                    {
                        "400": "invalid request",
                        "404": "unknown model",
                        "413": "request body too large",
                        "503": "no engine ready, or every engine overloaded (Retry-After)",
                    }
                ),
            },
        }
    }


def _get(
    summary: str,
    answers: dict[str, str],
    errors: dict[str, str] | None = None,
    **operation: Any,
) -> dict[str, Any]:
    """A GET: ``answers`` are described only, ``errors`` carry OpenAI's error body."""
    described = {status: {"description": text} for status, text in answers.items()}
    responses = {**described, **_errors(errors or {})}
    return {"get": {"summary": summary, **operation, "responses": responses}}


def _errors(statuses: dict[str, str]) -> dict[str, Any]:
    return {
        status: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
        for status, text in statuses.items()
    }


def openapi_document() -> dict[str, Any]:
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_SAMPLING,
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {
                        "role": {"type": "string", "enum": list(ROLES)},
                        "content": {
                            "oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}],
                            "description": "an assistant message may leave it out or send null",
                        },
                    },
                },
            },
        },
    }
    completion = {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            **_SAMPLING,
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0},
                        "minItems": 1,
                        "description": "token ids, each below the model's vocabulary size",
                    },
                ]
            },
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "dynask", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion (OpenAI-compatible)", chat),
            "/v1/completions": _post("Text completion (OpenAI-compatible)", completion),
            "/v1/models": _get("Served models", {"200": "list"}),
            "/v1/routing/decisions": _get(
                "Recent routing decisions with every candidate's terms",
                {"200": "list, newest first"},
                {"400": "limit outside [1, the decision log's size]", "404": "unknown model"},
                parameters=[
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "model", "in": "query", "schema": {"type": "string"}},
                ],
            ),
            "/health": _get(
                "Readiness",
                {"200": "ready", "503": '{"status": "starting"}: no engine ready yet'},
            ),
            "/live": _get("Liveness", {"200": "live"}),
            "/metrics": _get("Prometheus metrics", {"200": "text"}),
        },
    }
