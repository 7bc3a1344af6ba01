"""A response's output as Responses API items, and the events that stream them.

``ResponseWriter`` takes the chat output parser's deltas and keeps the output items: a
``reasoning`` item, a ``message`` with one ``output_text`` part, ``function_call``s. Each
delta also yields the standard events: ``response.output_item.added``, then
``response.content_part.added`` and ``response.output_text.delta`` (or
``response.reasoning_text.delta``, ``response.function_call_arguments.delta``), closed by
the matching ``.done`` events when the next item starts or the output ends.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

from dynask.actors.api.outputs import Usage
from dynask.control_plane.api.chat_output import ChatDelta

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseWriter:
    def __init__(self, response_id: str, model: str, echo: dict[str, Any]) -> None:
        self.id = response_id
        self.model = model
        self.echo = echo
        self.created_at = int(time.time())
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._sequence = 0
        self.status = "in_progress"
        self.usage: Usage | None = None
        self.incomplete_reason: str | None = None

    # ---- the events -------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        # A copy: the items keep growing after their event is written.
        event = {"type": kind, "sequence_number": self._sequence, **copy.deepcopy(fields)}
        self._sequence += 1
        return event

    def opening(self) -> list[Event]:
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def feed(self, delta: ChatDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._text("reasoning", delta.reasoning)
        if delta.content:
            events += self._text("message", delta.content)
        for piece in delta.tool_calls:
            if piece.id is not None:
                events += self._close()
                item = {
                    "type": "function_call",
                    "id": new_id("fc"),
                    "call_id": piece.id,
                    "name": piece.name,
                    "arguments": "",
                    "status": "in_progress",
                }
                events += self._add(item)
            if piece.arguments and self._open is not None:
                self._open["arguments"] += piece.arguments
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=self._open["id"],
                        output_index=len(self.items) - 1,
                        delta=piece.arguments,
                    )
                )
        return events

    def finish(self, finish_reason: str | None, usage: Usage | None) -> list[Event]:
        events = self._close()
        self.usage = usage
        if finish_reason == "length":
            self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
            return [*events, self._event("response.incomplete", response=self.response())]
        self.status = "completed"
        return [*events, self._event("response.completed", response=self.response())]

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            item: dict[str, Any]
            if kind == "message":
                item = {
                    "type": "message",
                    "id": new_id("msg"),
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                }
            else:
                item = {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}
            events += self._add(item)
            part = _part(kind, "")
            item["content"].append(part)
            events.append(self._event("response.content_part.added", **self._where(), part=part))
        assert self._open is not None
        self._open["content"][0]["text"] += text
        name = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        events.append(self._event(name, **self._where(), delta=text))
        return events

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {
            "item_id": self._open["id"],
            "output_index": len(self.items) - 1,
            "content_index": 0,
        }

    def _add(self, item: dict[str, Any]) -> list[Event]:
        self.items.append(item)
        self._open = item
        return [
            self._event("response.output_item.added", output_index=len(self.items) - 1, item=item)
        ]

    def _close(self) -> list[Event]:
        item = self._open
        if item is None:
            return []
        events: list[Event] = []
        if item["type"] == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=len(self.items) - 1,
                    arguments=item["arguments"],
                )
            )
        else:
            part = item["content"][0]
            done = (
                "response.output_text.done"
                if item["type"] == "message"
                else "response.reasoning_text.done"
            )
            events.append(self._event(done, **self._where(), text=part["text"]))
            events.append(self._event("response.content_part.done", **self._where(), part=part))
        if "status" in item:
            item["status"] = "completed"
        events.append(
            self._event("response.output_item.done", output_index=len(self.items) - 1, item=item)
        )
        self._open = None
        return events

    # ---- the response object ----------------------------------------------------

    def response(self) -> dict[str, Any]:
        usage = self.usage
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": copy.deepcopy(self.items),
            "error": None,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.incomplete_reason else None
            ),
            "usage": None if usage is None else usage_dict(usage),
            "reasoning": {"effort": None, "summary": None},
            **self.echo,
        }


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "reasoning_text", "text": text}


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as chat messages, for the stored conversation."""
    content = "".join(
        part["text"] for item in items if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in items
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return [message]
