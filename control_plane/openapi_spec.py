"""A hand-written OpenAPI 3.1 document for the endpoints we serve."""

from __future__ import annotations

from typing import Any

from dynask.control_plane.kv_router import ROUTING_MODES

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
    "top_k": {"type": "integer", "minimum": -1},
    "seed": {"type": "integer"},
    "stop": {
        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]
    },
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "n": {"type": "integer", "enum": [1]},
    "ignore_eos": {"type": "boolean"},
    "router_mode": {"type": "string", "enum": list(ROUTING_MODES)},
}


def _post(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {"description": "JSON, or an SSE stream when stream=true"},
                "400": {
                    "description": "invalid request",
                    "content": {"application/json": {"schema": _ERROR}},
                },
                "404": {
                    "description": "unknown model",
                    "content": {"application/json": {"schema": _ERROR}},
                },
                "503": {
                    "description": "no engine ready, or every engine overloaded (Retry-After)",
                    "content": {"application/json": {"schema": _ERROR}},
                },
            },
        }
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
                    "required": ["role"],
                    "properties": {
                        "role": {"type": "string"},
                        "content": {"type": ["string", "array", "null"]},
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
                "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]
            },
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "dynask", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion (OpenAI-compatible)", chat),
            "/v1/completions": _post("Text completion (OpenAI-compatible)", completion),
            "/v1/models": {
                "get": {"summary": "Served models", "responses": {"200": {"description": "list"}}}
            },
            "/v1/routing/decisions": {
                "get": {
                    "summary": "Recent routing decisions with every candidate's terms",
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                        {"name": "model", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {"200": {"description": "list, newest first"}},
                }
            },
            "/health": {
                "get": {
                    "summary": "503 until an engine is ready",
                    "responses": {"200": {"description": "ready"}},
                }
            },
            "/live": {
                "get": {"summary": "Liveness", "responses": {"200": {"description": "live"}}}
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "text"}},
                }
            },
        },
    }
