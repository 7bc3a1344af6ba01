"""The OpenAI-compatible endpoints: chat completions, completions, models.

Streaming responses are SSE (sse-starlette): one ``data:`` event per delta, a final chunk
with ``finish_reason``, an optional usage chunk (``stream_options.include_usage``), then
``data: [DONE]``. When the client disconnects, the response generator is cancelled and
``ActorHandle.generate`` aborts the request on its actor, which frees its blocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.control_plane.api.chat_output import ChatOptions, ChatPlan
from dynask.control_plane.api.chat_prompt import render_chat_request
from dynask.control_plane.api.chat_shapes import delta_dict, message_dict
from dynask.control_plane.api.errors import APIError, from_serving
from dynask.control_plane.api.internal_errors import internal_error
from dynask.control_plane.api.openapi_document import GENERATION_ERRORS, ApiRoute, Operation
from dynask.control_plane.api.request_schema import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    parse_chat,
    parse_completion,
)
from dynask.control_plane.api.sse import TokenEventResponse
from dynask.control_plane.api.tools.tool_request import parse_tool_request
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.request import GenerationRequest, PreparedRequest
from dynask.control_plane.serving.service import ServingService

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 2**20


def make_openai_routes(
    service: ServingService, chat_options: ChatOptions | None = None
) -> list[ApiRoute]:
    """The OpenAI routes; ``chat_options``: the tool-call and reasoning parsers."""
    options = chat_options or ChatOptions()

    async def chat(request: Request) -> Response:
        return await _serve(service, request, parse_chat, _ChatFormat, options)

    async def completions(request: Request) -> Response:
        return await _serve(service, request, parse_completion, _CompletionFormat, options)

    async def models(_: Request) -> Response:
        data = [
            {
                "id": m.name,
                "object": "model",
                "created": m.created,
                "owned_by": "dynask",
                "max_model_len": m.max_model_len,
            }
            for m in service.models.values()
            if m.actors
        ]
        return JSONResponse({"object": "list", "data": data})

    return [
        ApiRoute("/v1/chat/completions", chat, methods=["POST"], operation=CHAT_OPERATION),
        ApiRoute("/v1/completions", completions, methods=["POST"], operation=COMPLETION_OPERATION),
        ApiRoute(
            "/v1/models",
            models,
            methods=["GET"],
            operation=Operation("Served models", {"200": "OpenAI's list of models"}),
        ),
    ]


_GENERATED = {"200": "JSON, or an SSE stream when stream=true"}
CHAT_OPERATION = Operation(
    "Chat completion (OpenAI-compatible)",
    _GENERATED,
    GENERATION_ERRORS,
    body=CHAT_FIELDS,
    required=("model", "messages"),
)
COMPLETION_OPERATION = Operation(
    "Text completion (OpenAI-compatible)",
    _GENERATED,
    GENERATION_ERRORS,
    body=COMPLETION_FIELDS,
    required=("model", "prompt"),
)


async def read_json(request: Request) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(
            f"the request body has {len(body)} bytes; the limit is {MAX_BODY_BYTES}",
            status=413,
            code="body_too_large",
        )
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(
            f"the request body is not valid JSON: {exc}", param="body", code="invalid_json"
        ) from exc
    except RecursionError as exc:  # the parser recurses once per nested array or object
        raise APIError(
            "the request body is not valid JSON for dynask: its arrays or objects are nested "
            "too deeply",
            param="body",
            code="invalid_json",
        ) from exc


async def _serve(
    service: ServingService,
    request: Request,
    parse: Callable[[Any], GenerationRequest],
    fmt: type[_Format],
    chat_options: ChatOptions,
) -> Response:
    started = time.monotonic()
    body = await read_json(request)
    parsed = parse(body)
    if service.request_hook is not None:  # an inference graph's custom Processor
        parsed = await service.request_hook(parsed)
    plan = None
    if parsed.messages is not None:  # tools and the template: the prompt as token ids
        tools = parse_tool_request(body)
        parsed, plan = await asyncio.to_thread(
            render_chat_request, service, parsed, tools, chat_options
        )
    # The chat template and the tokenizer take a CPU second per MB of text: not on the loop.
    prepared = await asyncio.to_thread(service.prepare, parsed, fmt.id_prefix)
    formatter = fmt(prepared, parsed.model, plan)
    tenant = service.tenant(request.scope.get("state", {}).get("tenant"), parsed.user)
    admitted = service.admit(prepared, tenant)  # before any response: a 503 stays a 503
    metrics = service.metrics
    metrics.input_tokens.labels(parsed.model).inc(len(prepared.prompt_ids))
    if parsed.stream:  # on_close: a body that never started still gives everything back
        events = _sse_events(service, admitted, formatter, parsed.include_usage, started)
        return TokenEventResponse(events, ping=600, sep="\n", on_close=admitted.release)
    with admitted:
        outputs = [o async for batch in tracked_outputs(service, admitted, started) for o in batch]
    return JSONResponse(formatter.whole(outputs))


async def tracked_outputs(
    service: ServingService, admitted: AdmittedRequest, started: float
) -> AsyncIterator[list[RequestOutput]]:
    """The request's deltas as they arrive (in batches), with metrics recorded on the way.

    Inter-token latency is the gap between two arrivals spread over the tokens of the
    later one: deltas that arrive together reach the client in one write.
    """
    prepared = admitted.prepared
    metrics, model = service.metrics, prepared.model.name
    ttft, itl = metrics.ttft.labels(model), metrics.itl.labels(model)  # resolved once
    output_tokens = metrics.output_tokens.labels(model)
    metrics.in_flight.inc()
    status, last, first, tokens = "error", None, 0.0, 0
    try:
        async for outputs in service.generate(admitted):
            now = time.monotonic()
            if last is None:
                first = now
                ttft.observe(now - started)
            else:
                tokens += len(outputs)
                for _ in outputs:
                    itl.observe((now - last) / len(outputs))
            last = now
            output_tokens.inc(sum(len(o.token_ids) for o in outputs))
            final = outputs[-1]
            _raise_if_aborted(prepared, final)
            if final.usage is not None:
                metrics.observe_usage(model, final.usage.prompt_tokens, final.usage.cached_tokens)
            yield outputs
        status = "ok"
        metrics.latency_window.observe_stream(model, first - started, last, first, tokens)
    finally:
        metrics.in_flight.dec()
        metrics.requests.labels(model, prepared.request_id.split("-")[0], status).inc()


def _raise_if_aborted(prepared: PreparedRequest, output: RequestOutput) -> None:
    if output.finish_reason is FinishReason.ABORT:
        raise APIError(
            f"the engine stopped request {prepared.request_id} before it finished"
            + (f": {output.error}" if output.error else ""),
            status=500,
            code="engine_aborted",
        )


async def _sse_events(
    service: ServingService,
    admitted: AdmittedRequest,
    formatter: _Format,
    include_usage: bool,
    started: float,
) -> AsyncIterator[bytes]:
    """Ready-made SSE events (bytes pass through sse-starlette untouched), one write per
    batch of deltas that arrived together."""
    first = formatter.opening()
    if first is not None:
        yield sse_event(first)
    try:
        async for outputs in tracked_outputs(service, admitted, started):
            events = [formatter.chunk_event(output) for output in outputs]
            last = outputs[-1]
            if last.finished and include_usage and last.usage is not None:
                events.append(sse_event(formatter.usage_chunk(last.usage)))
            yield b"".join(events)
    except APIError as exc:  # the status line is sent already: report it in the stream
        yield sse_event(exc.body())
    except ServingError as exc:
        yield sse_event(from_serving(exc).body())
    except Exception as exc:  # the same for a failure of ours: an error event, then [DONE]
        log.exception("stream %s failed after it started", admitted.prepared.request_id)
        yield sse_event(internal_error(exc).body())
    yield b"data: [DONE]\n\n"


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


class _Format:
    id_prefix = "x"
    object_whole = ""
    object_chunk = ""

    def __init__(self, prepared: PreparedRequest, model: str, plan: ChatPlan | None) -> None:
        self.id = prepared.request_id
        self.model = model
        self.created = int(time.time())
        self._template: tuple[bytes, bytes] | None = None

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def opening(self) -> dict[str, Any] | None:
        return None

    def chunk(self, output: RequestOutput) -> dict[str, Any]:
        raise NotImplementedError

    def chunk_event(self, output: RequestOutput) -> bytes:
        """The SSE event of one delta. Mid-stream deltas (the hot path: one per token) are
        spliced into a pre-encoded envelope instead of serialising the whole chunk again."""
        if output.finished:
            return sse_event(self.chunk(output))
        if self._template is None:
            marker = "\x00TEXT\x00"
            whole = json.dumps(self.chunk(_with_text(output, marker)), separators=(",", ":"))
            head, tail = whole.split(json.dumps(marker))
            self._template = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        head_bytes, tail_bytes = self._template
        return head_bytes + json.dumps(output.text).encode() + tail_bytes

    def whole(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self._envelope(self.object_chunk, []), "usage": usage_dict(usage)}


def _with_text(output: RequestOutput, text: str) -> RequestOutput:
    return RequestOutput(output.request_id, text, output.token_ids)


def _finish(output: RequestOutput) -> str | None:
    reason = output.finish_reason
    return None if reason is None else reason.value


class _ChatFormat(_Format):
    id_prefix = "chatcmpl"
    object_whole = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def __init__(self, prepared: PreparedRequest, model: str, plan: ChatPlan | None) -> None:
        super().__init__(prepared, model, plan)
        # Reasoning and tool calls: the output goes through parsers (chat_output).
        self.parser = plan.parser() if plan is not None and plan.parses else None

    def chunk_event(self, output: RequestOutput) -> bytes:
        if self.parser is None:
            return super().chunk_event(output)
        delta = self.parser.feed(output.text)
        events = [self._parsed_chunk(delta_dict(delta), None)] if delta else []
        if output.finished:
            rest = delta_dict(self.parser.finish())
            events.append(self._parsed_chunk(rest, self.parser.finish_reason(_finish(output))))
        return b"".join(sse_event(e) for e in events)

    def _parsed_chunk(self, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        return self._envelope(self.object_chunk, [choice])

    def opening(self) -> dict[str, Any]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        return self._envelope(self.object_chunk, [choice])

    def chunk(self, output: RequestOutput) -> dict[str, Any]:
        delta = {"content": output.text} if output.text or not output.finished else {}
        choice = {"index": 0, "delta": delta, "finish_reason": _finish(output)}
        return self._envelope(self.object_chunk, [choice])

    def whole(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        text = "".join(o.text for o in outputs)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason = _finish(outputs[-1])
        if self.parser is not None:
            message = message_dict(self.parser, [o.text for o in outputs])
            reason = self.parser.finish_reason(reason)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": reason,
            "logprobs": None,
        }
        return {
            **self._envelope(self.object_whole, [choice]),
            "usage": usage_dict(outputs[-1].usage),
        }


class _CompletionFormat(_Format):
    id_prefix = "cmpl"
    object_whole = "text_completion"
    object_chunk = "text_completion"

    def chunk(self, output: RequestOutput) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": output.text,
            "finish_reason": _finish(output),
            "logprobs": None,
        }
        return self._envelope(self.object_chunk, [choice])

    def whole(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        text = "".join(o.text for o in outputs)
        choice = {"index": 0, "text": text, "finish_reason": _finish(outputs[-1]), "logprobs": None}
        return {
            **self._envelope(self.object_whole, [choice]),
            "usage": usage_dict(outputs[-1].usage),
        }
