"""``POST /v1/messages`` (streamed or whole) and ``POST /v1/messages/count_tokens``.

Served by the chat pipeline (prepare, route, generate); every error, before or during a
stream, is Anthropic-shaped. The API key may come as ``x-api-key`` (Anthropic's header)
or ``Authorization: Bearer`` (``key_guard``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dynask.actors.api.outputs import RequestOutput
from dynask.control_plane.api.anthropic.blocks import MessageWriter, error_body
from dynask.control_plane.api.anthropic.request import parse_messages
from dynask.control_plane.api.chat_output import ChatOptions, ChatPlan, plan_chat
from dynask.control_plane.api.chat_prompt import render_chat_request
from dynask.control_plane.api.errors import APIError, from_serving
from dynask.control_plane.api.openai_routes import read_json, request_tenant, tracked_outputs
from dynask.control_plane.api.openapi_document import ApiRoute, Operation
from dynask.control_plane.api.request_schema import parse_chat
from dynask.control_plane.api.sse import TokenEventResponse
from dynask.control_plane.api.tools.tool_request import parse_tool_request
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.service import ServingService

Handler = Callable[[Request], Awaitable[Response]]


def make_anthropic_routes(
    service: ServingService, chat_options: ChatOptions | None = None
) -> list[Route]:
    options = chat_options or ChatOptions()

    async def messages(request: Request) -> Response:
        return await _messages(service, options, request)

    async def count_tokens(request: Request) -> Response:
        parsed = parse_messages(await read_json(request), count_only=True)
        body = {**parsed.chat_body, "max_tokens": 1}
        chat = parse_chat(body)
        assert chat.messages is not None
        service.refuse_obviously_too_long(chat)
        model = service.model(chat.model)
        engines = {a.info.engine for a in model.actors}
        tools = parse_tool_request(body)

        def count() -> int:  # templating and tokenizing: not on the event loop
            assert chat.messages is not None
            text, _ = plan_chat(model.tokenizer, chat.messages, tools, options, model.name, engines)
            return len(model.tokenizer.encode(text, add_special_tokens=False))

        return JSONResponse({"input_tokens": await asyncio.to_thread(count)})

    errors = {
        "400": "invalid request (an Anthropic-shaped error)",
        "404": "unknown model",
        "429": "the tenant is over a limit",
        "503": "no engine can take the request now",
    }
    return [
        ApiRoute(
            "/v1/messages",
            _anthropic_errors(messages),
            methods=["POST"],
            operation=Operation(
                "Create a message (the Anthropic Messages API; streamed with `stream: true`)",
                {"200": "a message, or Anthropic's server-sent events when streamed"},
                errors,
            ),
        ),
        ApiRoute(
            "/v1/messages/count_tokens",
            _anthropic_errors(count_tokens),
            methods=["POST"],
            operation=Operation(
                "Count a message request's input tokens", {"200": "`{input_tokens}`"}, errors
            ),
        ),
    ]


def _anthropic_errors(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except (APIError, ServingError) as error:
            exc = error if isinstance(error, APIError) else from_serving(error)
            return JSONResponse(error_body(exc.status, exc.message), exc.status, exc.headers)

    return wrapped


async def _messages(service: ServingService, options: ChatOptions, request: Request) -> Response:
    started = time.monotonic()
    parsed = parse_messages(await read_json(request))
    body = parsed.chat_body
    # templating and tokenizing take a CPU second per MB of text: not on the event loop
    chat_request = parse_chat(body)
    tenant = request_tenant(service, request, chat_request.user)
    service.refuse_early(tenant)  # before the costly templating: a noisy tenant is cheap
    chat, plan = await asyncio.to_thread(
        render_chat_request, service, chat_request, parse_tool_request(body), options
    )
    prepared = await asyncio.to_thread(service.prepare, chat, "msg")
    admitted = await service.enter(prepared, tenant)
    message_id = "msg_" + prepared.request_id.split("-", 1)[1]
    writer = MessageWriter(message_id, parsed.model, len(prepared.prompt_ids))
    reply = _Reply(admitted, plan, writer)
    if parsed.stream:
        events = _stream(service, reply, started)
        return TokenEventResponse(events, ping=600, sep="\n", on_close=admitted.release)
    with admitted:
        async for outputs in tracked_outputs(service, admitted, started):
            for output in outputs:
                reply.feed(output)
    return JSONResponse(reply.writer.message())


class _Reply:
    """One reply being written: the chat output parser feeding the block writer."""

    def __init__(self, admitted: AdmittedRequest, plan: ChatPlan, writer: MessageWriter) -> None:
        self.admitted = admitted
        self.writer = writer
        self.parser = plan.parser()

    def feed(self, output: RequestOutput) -> list[dict[str, Any]]:
        events = self.writer.feed(self.parser.feed(output.text))
        if output.finished:
            events += self.writer.feed(self.parser.finish())
            reason = output.finish_reason.value if output.finish_reason else None
            events += self.writer.finish(output, self.parser.finish_reason(reason))
        return events


async def _stream(service: ServingService, reply: _Reply, started: float) -> AsyncIterator[bytes]:
    yield _events(reply.writer.opening())
    try:
        async for outputs in tracked_outputs(service, reply.admitted, started):
            yield _events([e for output in outputs for e in reply.feed(output)])
    except (APIError, ServingError) as error:  # the status line is sent: report it in-stream
        exc = error if isinstance(error, APIError) else from_serving(error)
        yield _events([error_body(exc.status, exc.message)])


def _events(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {e['type']}\ndata: {json.dumps(e, separators=(',', ':'))}\n\n".encode()
        for e in events
    )
