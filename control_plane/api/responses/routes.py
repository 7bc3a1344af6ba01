"""``POST /v1/responses`` (streamed or whole), ``GET`` and ``DELETE /v1/responses/{id}``.

Design decisions:
- A response is served as the chat request it translates to (``request``), through the
  same prepare/route/generate pipeline, so routing, admission, migration and metrics are
  the chat API's.
- ``store`` (OpenAI's default: true) writes the response and its whole conversation to the
  database after it completes; ``previous_response_id`` reads that row back. A stream is
  stored when its last event is written. Without a database (an app built with no store)
  ``store`` is ignored and ``previous_response_id`` is a 400.
- The stream sends ``event:`` and ``data:`` lines, as OpenAI does, and no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dynask.actors.api.outputs import RequestOutput
from dynask.control_plane.api.chat_output import ChatOptions, ChatOutputParser, ChatPlan
from dynask.control_plane.api.chat_prompt import render_chat_request
from dynask.control_plane.api.errors import APIError, from_serving
from dynask.control_plane.api.openai_routes import read_json, request_tenant, tracked_outputs
from dynask.control_plane.api.openapi_document import ApiRoute, Operation
from dynask.control_plane.api.request_schema import parse_chat
from dynask.control_plane.api.responses.items import ResponseWriter, output_messages
from dynask.control_plane.api.responses.request import ResponsesRequest, parse_responses
from dynask.control_plane.api.sse import TokenEventResponse
from dynask.control_plane.api.tools.tool_request import parse_tool_request
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.response_store import ResponseStore


def make_responses_routes(
    service: ServingService, store: ResponseStore | None, chat_options: ChatOptions | None = None
) -> list[Route]:
    options = chat_options or ChatOptions()

    async def create(request: Request) -> Response:
        return await _create(service, store, options, request)

    async def retrieve(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        stored = await asyncio.to_thread(store.get, response_id) if store else None
        if stored is None:
            raise _not_found(response_id, "response_id")
        return JSONResponse(stored.body)

    async def delete(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        deleted = await asyncio.to_thread(store.delete, response_id) if store else False
        if not deleted:
            raise _not_found(response_id, "response_id")
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    not_found = {"404": "no stored response has this id"}
    return [
        ApiRoute("/v1/responses", create, methods=["POST"], operation=CREATE),
        ApiRoute(
            "/v1/responses/{response_id}",
            retrieve,
            methods=["GET"],
            operation=Operation("Retrieve a stored response", {"200": "the response"}, not_found),
        ),
        ApiRoute(
            "/v1/responses/{response_id}",
            delete,
            methods=["DELETE"],
            operation=Operation("Delete a stored response", {"200": "deleted"}, not_found),
        ),
    ]


CREATE = Operation(
    "Create a model response (the Responses API; streamed with `stream: true`)",
    {"200": "a response object, or its server-sent events when streamed"},
    {
        "400": "invalid request (every unserved field is refused by name)",
        "404": "unknown model or previous_response_id",
        "429": "the tenant is over a limit",
        "503": "no engine can take the request now",
    },
)


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(
        f"no stored response has the id {json.dumps(response_id)} (responses are stored "
        "when created with store: true)",
        status=404,
        param=param,
        code="response_not_found",
    )


class _Exchange:
    """One response being made: its request, routed generation, parser and writer."""

    def __init__(
        self,
        parsed: ResponsesRequest,
        conversation: list[dict[str, Any]],
        admitted: AdmittedRequest,
        plan: ChatPlan,
        store: ResponseStore | None,
    ) -> None:
        self.parsed = parsed
        self.conversation = conversation
        self.admitted = admitted
        self.store = store
        self.parser: ChatOutputParser = plan.parser()
        response_id = "resp_" + admitted.prepared.request_id.split("-", 1)[1]
        self.writer = ResponseWriter(response_id, parsed.model, parsed.echo)

    def feed(self, output: RequestOutput) -> list[dict[str, Any]]:
        events = self.writer.feed(self.parser.feed(output.text))
        if output.finished:
            events += self.writer.feed(self.parser.finish())
            reason = output.finish_reason.value if output.finish_reason else None
            events += self.writer.finish(self.parser.finish_reason(reason), output.usage)
        return events

    async def save(self) -> None:
        if not (self.parsed.store and self.store is not None):
            return
        conversation = [*self.conversation, *output_messages(self.writer.items)]
        await asyncio.to_thread(
            self.store.save,
            self.writer.id,
            self.parsed.model,
            self.parsed.previous_response_id,
            conversation,
            self.writer.response(),
        )


async def _create(
    service: ServingService, store: ResponseStore | None, options: ChatOptions, request: Request
) -> Response:
    started = time.monotonic()
    parsed = parse_responses(await read_json(request))
    history: list[dict[str, Any]] = []
    if parsed.previous_response_id is not None:
        stored = await asyncio.to_thread(store.get, parsed.previous_response_id) if store else None
        if stored is None:
            raise _not_found(parsed.previous_response_id, "previous_response_id")
        history = stored.conversation
    conversation = [*history, *parsed.input_messages]
    system = [{"role": "system", "content": parsed.instructions}] if parsed.instructions else []
    body = {**parsed.chat_body, "messages": [*system, *conversation]}
    # templating and tokenizing take a CPU second per MB of text: not on the event loop
    chat_request = parse_chat(body)
    tenant = request_tenant(service, request, chat_request.user)
    service.refuse_early(tenant)  # before the costly templating: a noisy tenant is cheap
    chat, plan = await asyncio.to_thread(
        render_chat_request, service, chat_request, parse_tool_request(body), options
    )
    prepared = await asyncio.to_thread(service.prepare, chat, "resp")
    admitted = await service.enter(prepared, tenant)
    exchange = _Exchange(parsed, conversation, admitted, plan, store)
    if parsed.stream:
        events = _stream(service, exchange, started)
        return TokenEventResponse(events, ping=600, sep="\n", on_close=admitted.release)
    with admitted:
        async for outputs in tracked_outputs(service, admitted, started):
            for output in outputs:
                exchange.feed(output)
    await exchange.save()
    return JSONResponse(exchange.writer.response())


async def _stream(
    service: ServingService, exchange: _Exchange, started: float
) -> AsyncIterator[bytes]:
    yield _events(exchange.writer.opening())
    try:
        async for outputs in tracked_outputs(service, exchange.admitted, started):
            yield _events([e for output in outputs for e in exchange.feed(output)])
    except (APIError, ServingError) as error:  # the status line is sent: report it in the stream
        exc = error if isinstance(error, APIError) else from_serving(error)
        writer = exchange.writer
        writer.status = "failed"
        failed = {**writer.response(), "error": {"code": exc.code, "message": exc.message}}
        yield _events([{"type": "response.failed", "sequence_number": -1, "response": failed}])
        return
    await exchange.save()


def _events(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {e['type']}\ndata: {json.dumps(e, separators=(',', ':'))}\n\n".encode()
        for e in events
    )
