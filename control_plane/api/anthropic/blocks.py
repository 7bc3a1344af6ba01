"""A reply as Anthropic content blocks, and the stream events that write them.

Blocks: ``thinking`` (the model's ``<think>`` reasoning), ``text``, ``tool_use``. A block
is opened by ``content_block_start``, grown by ``content_block_delta`` (``thinking_delta``,
``text_delta``, ``input_json_delta``) and closed by ``content_block_stop`` when the next
one starts or the reply ends; ``message_delta`` then carries the stop reason and usage.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import partial_json_parser

from dynask.actors.api.outputs import RequestOutput, Usage
from dynask.control_plane.api.chat_output import ChatDelta

Event = dict[str, Any]
_DELTA = {"thinking": "thinking_delta", "text": "text_delta"}


class MessageWriter:
    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.blocks: list[dict[str, Any]] = []
        self._open = False
        self._json: list[str] = []  # the open tool_use block's input, as JSON text
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: Usage | None = None

    def opening(self) -> list[Event]:
        return [{"type": "message_start", "message": {**self.message(), "content": []}}]

    def feed(self, delta: ChatDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._text("thinking", delta.reasoning)
        if delta.content:
            events += self._text("text", delta.content)
        for piece in delta.tool_calls:
            if piece.id is not None:
                events += self._close()
                events += self._start(
                    {
                        "type": "tool_use",
                        "id": _tool_use_id(piece.id),
                        "name": piece.name,
                        "input": {},
                    }
                )
            if piece.arguments:
                self._json.append(piece.arguments)
                events.append(
                    self._delta({"type": "input_json_delta", "partial_json": piece.arguments})
                )
        return events

    def finish(self, output: RequestOutput, finish_reason: str | None) -> list[Event]:
        events = self._close()
        self.usage = output.usage
        if finish_reason == "tool_calls":
            self.stop_reason = "tool_use"
        elif finish_reason == "length":
            self.stop_reason = "max_tokens"
        elif isinstance(output.stop_reason, str):
            self.stop_reason, self.stop_sequence = "stop_sequence", output.stop_reason
        else:
            self.stop_reason = "end_turn"
        tokens = output.usage.completion_tokens if output.usage else 0
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                "usage": {"output_tokens": tokens},
            }
        )
        events.append({"type": "message_stop"})
        return events

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if not (self._open and self.blocks[-1]["type"] == kind):
            events += self._close()
            block: dict[str, Any] = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = ""
            events += self._start(block)
        self.blocks[-1][kind] += text
        events.append(self._delta({"type": _DELTA[kind], kind: text}))
        return events

    def _start(self, block: dict[str, Any]) -> list[Event]:
        self.blocks.append(block)
        self._open = True
        index = len(self.blocks) - 1
        return [
            {"type": "content_block_start", "index": index, "content_block": copy.deepcopy(block)}
        ]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def _close(self) -> list[Event]:
        if not self._open:
            return []
        block = self.blocks[-1]
        if block["type"] == "tool_use":
            text = "".join(self._json)
            block["input"] = _input(text)
            self._json = []
        self._open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def message(self) -> dict[str, Any]:
        usage = self.usage
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": copy.deepcopy(self.blocks),
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": {
                "input_tokens": usage.prompt_tokens if usage else self.input_tokens,
                "output_tokens": usage.completion_tokens if usage else 0,
                "cache_read_input_tokens": usage.cached_tokens if usage else 0,
                "cache_creation_input_tokens": 0,
            },
        }


def _input(text: str) -> Any:
    """A tool_use block's input: the arguments' JSON, or as much of it as was written when
    the reply was cut short (``max_tokens``), completed by partial-json-parser."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return partial_json_parser.loads(text)
        except (partial_json_parser.JSONDecodeError, ValueError):
            return {}


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape; the type follows the status as Anthropic's do."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "overloaded_error",
        529: "overloaded_error",
    }
    return {
        "type": "error",
        "error": {
            "type": kinds.get(status, "api_error" if status >= 500 else "invalid_request_error"),
            "message": message,
        },
    }
