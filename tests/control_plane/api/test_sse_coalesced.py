"""Deltas that go out in one send (several SSE events in one body chunk, and the last
chunk, usage and ``[DONE]`` with the end of the response) reach the real ``openai``
client as separate, complete chunks; and the hot path's event bytes, exactly (issue 21).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.control_plane.api.sampling.logprobs_format import TokenTexts
from dynask.control_plane.api.sampling.response_format import ChatFormat, sse_event
from dynask.control_plane.api.sse import DONE_EVENT, FinalEvents, TokenEventResponse
from tests.control_plane.api.threaded_server import served_in_thread

RID = "chatcmpl-1"
TEXTS = ["Ca", "fé ", '"龘"\n']
USAGE = Usage(prompt_tokens=5, completion_tokens=4, cached_tokens=2)


def _formatter() -> ChatFormat:
    formatter = ChatFormat(RID, "m", TokenTexts(None))
    formatter.created = 1700000000
    return formatter


def _deltas() -> list[RequestOutput]:
    mid = [RequestOutput(RID, text, (i,)) for i, text in enumerate(TEXTS)]
    return [*mid, RequestOutput(RID, "!", (9,), FinishReason.STOP, usage=USAGE)]


def test_the_hot_path_event_bytes() -> None:
    formatter = _formatter()
    events = [formatter.chunk_event(delta) for delta in _deltas()[:2]]
    head = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,'
    assert events == [
        head + b'"model":"m","choices":[{"index":0,"delta":{"content":"Ca"},'
        b'"finish_reason":null}]}\n\n',
        head + b'"model":"m","choices":[{"index":0,"delta":{"content":"f\\u00e9 "},'
        b'"finish_reason":null}]}\n\n',
    ]


async def _coalesced(_: Request) -> Response:
    formatter = _formatter()

    async def events() -> AsyncIterator[bytes]:
        yield b"".join(sse_event(e) for e in formatter.opening())
        *mid, final = _deltas()
        yield b"".join(formatter.chunk_event(delta) for delta in mid)  # three in one send
        last = formatter.chunk_event(final) + sse_event(formatter.usage_chunk(USAGE))
        yield FinalEvents(last + DONE_EVENT)

    return TokenEventResponse(events(), ping=600, sep="\n")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/chat/completions", _coalesced, methods=["POST"])])
    with served_in_thread(app) as base:
        yield f"{base}/v1"


def test_coalesced_events_reach_the_openai_client_as_separate_chunks(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = list(stream)
    assert [c.choices[0].delta.content if c.choices else None for c in chunks] == [
        "",
        *TEXTS,
        "!",
        None,
    ]
    assert [c.choices[0].finish_reason if c.choices else None for c in chunks] == [
        None,
        None,
        None,
        None,
        "stop",
        None,
    ]
    assert {c.id for c in chunks} == {RID}
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (5, 4, 9)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 2
