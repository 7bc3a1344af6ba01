"""OpenAI response bodies built from engine deltas: chat and completions, whole or chunked.

A response has one choice per prompt and ``n`` (``index`` numbers them); usage counts
each prompt once and every choice's completion tokens. Deltas with logprobs carry their
tokens' share (``logprobs_format``); the others take the hot path, a pre-encoded
envelope per choice with the text spliced in. A chat ``ChatPlan`` that parses (tool
calls, reasoning) gives each choice its own parser, and its chunks carry parsed deltas.
"""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring_ascii  # json.dumps(str)'s own encoder
from typing import Any

from dynask.actors.api.outputs import RequestOutput, Usage
from dynask.control_plane.api.chat_output import ChatOutputParser, ChatPlan
from dynask.control_plane.api.chat_shapes import delta_dict, message_dict
from dynask.control_plane.api.sampling.logprobs_format import (
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
)


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage_dict(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def summed_usage(finals: list[RequestOutput], first_of_prompt: list[bool]) -> Usage | None:
    """Usage of several choices: each prompt (and its cache hit) once, every completion."""
    usages = [o.usage for o in finals]
    if any(u is None for u in usages):
        return None
    counted = [u for u in usages if u is not None]
    prompts = [u for u, first in zip(counted, first_of_prompt, strict=True) if first]
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in prompts),
        completion_tokens=sum(u.completion_tokens for u in counted),
        cached_tokens=sum(u.cached_tokens for u in prompts),
    )


class ResponseFormat:
    """One response's id, model and the per-choice state of its chunks."""

    id_prefix = "x"
    object_whole = ""
    object_chunk = ""

    def __init__(
        self,
        request_id: str,
        model: str,
        texts: TokenTexts,
        echoes: dict[int, str] | None = None,
        plan: ChatPlan | None = None,
    ) -> None:
        self.id = request_id
        self.plan = plan
        self.model = model
        self.created = int(time.time())
        self.texts = texts
        self.echoes = echoes or {}  # choice index -> echoed prompt text (completions)
        self._templates: dict[int, tuple[bytes, bytes]] = {}
        self._offsets: dict[int, int] = {}  # choice index -> text streamed so far

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def opening(self, indexes: range = range(1)) -> list[dict[str, Any]]:
        return []

    def chunk(self, output: RequestOutput, index: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def whole(self, choices: list[list[RequestOutput]], usage: Usage | None) -> dict[str, Any]:
        raise NotImplementedError

    def chunk_event(self, output: RequestOutput, index: int = 0) -> bytes:
        """The SSE event of one delta. Mid-stream deltas without logprobs (the hot path:
        one per token) are spliced into a pre-encoded envelope instead of serialising the
        whole chunk again."""
        if output.finished or output.logprobs is not None or index in self.echoes:
            return sse_event(self.chunk(output, index))
        template = self._templates.get(index)
        if template is None:
            marker = "\x00TEXT\x00"
            plain = RequestOutput(output.request_id, marker, output.token_ids)
            whole = json.dumps(self.chunk(plain, index), separators=(",", ":"))
            head, tail = whole.split(json.dumps(marker))
            template = self._templates[index] = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        return template[0] + encode_basestring_ascii(output.text).encode() + template[1]

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self._envelope(self.object_chunk, []), "usage": usage_dict(usage)}

    def _streamed_text(self, output: RequestOutput, index: int) -> str:
        """The delta's text, after the echoed prompt if this is the choice's first chunk."""
        echo = self.echoes.pop(index, None)
        return output.text if echo is None else echo + output.text


def _finish(output: RequestOutput) -> str | None:
    reason = output.finish_reason
    return None if reason is None else reason.value


class ChatFormat(ResponseFormat):
    id_prefix = "chatcmpl"
    object_whole = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def opening(self, indexes: range = range(1)) -> list[dict[str, Any]]:
        choices = [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            for i in indexes
        ]
        return [self._envelope(self.object_chunk, choices)]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Reasoning and tool calls: each choice's output goes through its parser.
        self._parsers: dict[int, ChatOutputParser] = {}

    def _parser(self, index: int) -> ChatOutputParser | None:
        if self.plan is None or not self.plan.parses:
            return None
        if index not in self._parsers:
            self._parsers[index] = self.plan.parser()
        return self._parsers[index]

    def chunk_event(self, output: RequestOutput, index: int = 0) -> bytes:
        parser = self._parser(index)
        if parser is None:
            return super().chunk_event(output, index)
        delta = parser.feed(output.text)
        logprobs = output.logprobs
        events = [self._parsed_chunk(index, delta_dict(delta), None, logprobs)] if delta else []
        if output.finished:
            rest = delta_dict(parser.finish())
            reason = parser.finish_reason(_finish(output))
            events.append(self._parsed_chunk(index, rest, reason, None if delta else logprobs))
        return b"".join(sse_event(e) for e in events)

    def _parsed_chunk(
        self, index: int, delta: dict[str, Any], reason: str | None, logprobs: Any
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
        if logprobs is not None:
            choice["logprobs"] = chat_logprobs(logprobs, self.texts)
        return self._envelope(self.object_chunk, [choice])

    def chunk(self, output: RequestOutput, index: int = 0) -> dict[str, Any]:
        delta = {"content": output.text} if output.text or not output.finished else {}
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": _finish(output)}
        if output.logprobs is not None:
            choice["logprobs"] = chat_logprobs(output.logprobs, self.texts)
        return self._envelope(self.object_chunk, [choice])

    def whole(self, choices: list[list[RequestOutput]], usage: Usage | None) -> dict[str, Any]:
        bodies = [self._choice(index, outputs) for index, outputs in enumerate(choices)]
        return {**self._envelope(self.object_whole, bodies), "usage": usage_dict(usage)}

    def _choice(self, index: int, outputs: list[RequestOutput]) -> dict[str, Any]:
        logprobs = _joined_logprobs(outputs)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(o.text for o in outputs)}
        reason = _finish(outputs[-1])
        parser = self._parser(index)
        if parser is not None:
            message = message_dict(parser, [o.text for o in outputs])
            reason = parser.finish_reason(reason)
        return {
            "index": index,
            "message": message,
            "finish_reason": reason,
            "logprobs": None if logprobs is None else chat_logprobs(logprobs, self.texts),
        }


class CompletionFormat(ResponseFormat):
    id_prefix = "cmpl"
    object_whole = "text_completion"
    object_chunk = "text_completion"

    def chunk(self, output: RequestOutput, index: int = 0) -> dict[str, Any]:
        text = self._streamed_text(output, index)
        logprobs = None
        if output.logprobs is not None:  # offsets count the echoed prompt and earlier chunks
            start = self._offsets.get(index, 0) + len(text) - len(output.text)
            logprobs = completion_logprobs(output.logprobs, self.texts, start)
            self._offsets[index] = start + len(output.text)
        choice = {
            "index": index,
            "text": text,
            "finish_reason": _finish(output),
            "logprobs": logprobs,
        }
        return self._envelope(self.object_chunk, [choice])

    def whole(self, choices: list[list[RequestOutput]], usage: Usage | None) -> dict[str, Any]:
        bodies = [self._choice(index, outputs) for index, outputs in enumerate(choices)]
        return {**self._envelope(self.object_whole, bodies), "usage": usage_dict(usage)}

    def _choice(self, index: int, outputs: list[RequestOutput]) -> dict[str, Any]:
        echo = self.echoes.get(index, "")
        joined = _joined_logprobs(outputs)
        logprobs = None if joined is None else completion_logprobs(joined, self.texts, len(echo))
        return {
            "index": index,
            "text": echo + "".join(o.text for o in outputs),
            "finish_reason": _finish(outputs[-1]),
            "logprobs": logprobs,
        }


def _joined_logprobs(outputs: list[RequestOutput]) -> tuple[Any, ...] | None:
    if all(o.logprobs is None for o in outputs):
        return None
    return tuple(lp for o in outputs for lp in o.logprobs or ())
