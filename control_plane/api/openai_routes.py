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

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.control_plane.api.chat_output import ChatOptions
from dynask.control_plane.api.chat_prompt import render_chat_request
from dynask.control_plane.api.errors import APIError, from_serving
from dynask.control_plane.api.internal_errors import internal_error
from dynask.control_plane.api.openapi_document import GENERATION_ERRORS, ApiRoute, Operation
from dynask.control_plane.api.request_schema import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    parse_chat,
    parse_completion,
)
from dynask.control_plane.api.sampling.choice_routes import serve_choices
from dynask.control_plane.api.sampling.logprobs_format import TokenTexts
from dynask.control_plane.api.sampling.response_format import (
    ChatFormat,
    CompletionFormat,
    ResponseFormat,
    sse_event,
)
from dynask.control_plane.api.sampling.sampling_support import check_sampling_support
from dynask.control_plane.api.sse import DONE_EVENT, FinalEvents, TokenEventResponse
from dynask.control_plane.api.tools.tool_request import parse_tool_request
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.request import GenerationRequest, PreparedRequest
from dynask.control_plane.serving.service import PRIORITY_HEADER, ServingService
from dynask.control_plane.serving.tenants import Tenant

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 2**20


def make_openai_routes(
    service: ServingService, chat_options: ChatOptions | None = None
) -> list[ApiRoute]:
    """The OpenAI routes; ``chat_options``: the tool-call and reasoning parsers."""
    options = chat_options or ChatOptions()

    async def chat(request: Request) -> Response:
        return await _serve(service, request, parse_chat, ChatFormat, options)

    async def completions(request: Request) -> Response:
        return await _serve(service, request, parse_completion, CompletionFormat, options)

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


def parse_json(body: bytes) -> Any:
    """``json.loads(body)``: the same values and the same errors, in about a third of the
    time for a long token-id prompt.

    orjson parses first; whatever it refuses (NaN, a lone surrogate escape, UTF-16 bodies,
    deep nesting) goes to ``json``, which then decides. Where both accept a body their
    values are equal (both keep the last of duplicate keys, both round floats correctly)
    but for one case: orjson reads an integer past 64 bits as a float, so a body whose
    values hold a float of 2**63 or more is read again by ``json``."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)
    return json.loads(body) if _holds_huge_float(value) else value


_HUGE = 2.0**63
_NO_FLOAT = frozenset({int, str, bool, type(None)})


def _holds_huge_float(value: Any) -> bool:
    """Whether a parsed body holds a float of magnitude 2**63 or more (iterative; a list
    holding no float, such as token ids, is passed over by one type check in C)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not abs(item) < _HUGE:  # inf and nan too (orjson gives neither, but still)
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list) and not _NO_FLOAT.issuperset(map(type, item)):
            stack.extend(item)
    return False


async def read_json(request: Request) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(
            f"the request body has {len(body)} bytes; the limit is {MAX_BODY_BYTES}",
            status=413,
            code="body_too_large",
        )
    try:
        return parse_json(body)
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
    fmt: type[ResponseFormat],
    chat_options: ChatOptions,
) -> Response:
    started = time.monotonic()
    body = await read_json(request)
    parsed = parse(body)
    if service.request_hook is not None:  # an inference graph's custom Processor
        parsed = await service.request_hook(parsed)
    check_sampling_support(service.model(parsed.model), parsed)
    tenant = request_tenant(service, request, parsed.user)
    service.refuse_early(tenant)  # before the costly templating: a noisy tenant is cheap
    plan = None
    if parsed.messages is not None:  # tools and the template: the prompt as token ids
        tools = parse_tool_request(body)
        parsed, plan = await asyncio.to_thread(
            render_chat_request, service, parsed, tools, chat_options
        )
    if parsed.n > 1 or parsed.best_of > 1 or len(parsed.prompts) > 1 or parsed.echo:
        follow = _follower(service, started)
        return await serve_choices(service, parsed, fmt, follow, plan, tenant)
    # The chat template and the tokenizer take a CPU second per MB of text: not on the loop.
    prepared = await asyncio.to_thread(service.prepare, parsed, fmt.id_prefix)
    texts = TokenTexts(prepared.model.tokenizer)
    formatter = fmt(prepared.request_id, parsed.model, texts, plan=plan)
    admitted = await service.enter(prepared, tenant)  # before any response: 503 stays 503
    metrics = service.metrics
    metrics.input_tokens.labels(parsed.model).inc(len(prepared.prompt_ids))
    if parsed.stream:  # on_close: a body that never started still gives everything back
        events = _sse_events(service, admitted, formatter, parsed.include_usage, started)
        return TokenEventResponse(events, ping=600, sep="\n", on_close=admitted.release)
    with admitted:
        outputs = [o async for batch in tracked_outputs(service, admitted, started) for o in batch]
    return JSONResponse(formatter.whole([outputs], outputs[-1].usage))


def request_tenant(service: ServingService, request: Request, user: str | None) -> Tenant:
    """The tenant of an HTTP request: its API key (``RequireApiKey`` put it in the scope's
    state), else its ``user``; the priority header may lower its class."""
    key = request.scope.get("state", {}).get("tenant")
    return service.tenant(key, user, request.headers.get(PRIORITY_HEADER))


def _follower(
    service: ServingService, started: float
) -> Callable[[AdmittedRequest], AsyncIterator[list[RequestOutput]]]:
    return lambda admitted: tracked_outputs(service, admitted, started)


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
    formatter: ResponseFormat,
    include_usage: bool,
    started: float,
) -> AsyncIterator[bytes]:
    """Ready-made SSE events (bytes pass through sse-starlette untouched), one write per
    batch of deltas that arrived together. The final batch (with its usage chunk) and
    ``[DONE]`` go out as one ``FinalEvents``, with the end of the response: the requests'
    generators end without waiting once the final delta is in, so it is not delayed."""
    for first in formatter.opening():
        yield sse_event(first)
    final = b""
    try:
        async for outputs in tracked_outputs(service, admitted, started):
            events = [formatter.chunk_event(output) for output in outputs]
            last = outputs[-1]
            if last.finished and include_usage and last.usage is not None:
                events.append(sse_event(formatter.usage_chunk(last.usage)))
            if last.finished:
                final = b"".join(events)
            else:
                yield b"".join(events)
    except APIError as exc:  # the status line is sent already: report it in the stream
        final += sse_event(exc.body())
    except ServingError as exc:
        final += sse_event(from_serving(exc).body())
    except Exception as exc:  # the same for a failure of ours: an error event, then [DONE]
        log.exception("stream %s failed after it started", admitted.prepared.request_id)
        final += sse_event(internal_error(exc).body())
    yield FinalEvents(final + DONE_EVENT)
