"""Bad and slow SSE clients stall no other stream, and lose nothing of their own.

Raw sockets against the real server (echo engine): a reader with a tiny receive buffer
that reads nothing for a while, a client that sends garbage, one that sends half a
request and stalls, one that leaves mid-stream. Meanwhile ordinary ``openai`` streams
finish in full; then the slow reader reads its whole stream.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path

import pytest

from tests.control_plane.routing_stack import MODEL, Stack, cluster_with_actors, serving_stack
from tests.control_plane.routing_stack import tokens as random_tokens

pytestmark = pytest.mark.slow

LONG = 2000  # tokens the slow reader's stream carries (~300 KB of SSE)


def _raw_request(prompt: list[int], max_tokens: int) -> bytes:
    body = json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    ).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _connect(
    port: int, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=2**20)


async def _ordinary_stream(stack: Stack, seed: int) -> int:
    stream = await stack.openai.completions.create(
        model=MODEL,
        prompt=random_tokens(seed=seed, blocks=2),
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = 0
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return usage


def test_slow_and_malformed_clients_do_not_stall_other_streams(tiny_llama_folder: Path) -> None:
    echo = {"delay_s": 0.002}

    async def main() -> None:
        async with (
            cluster_with_actors(tiny_llama_folder, 1, "echo", echo) as proxies,
            serving_stack(proxies) as stack,
        ):
            port = stack.http.base_url.port
            assert port is not None
            slow_reader, slow = await _connect(port, receive_buffer=2048)
            slow.write(_raw_request(random_tokens(seed=1, blocks=LONG // 16), LONG))
            _, garbage = await _connect(port)
            garbage.write(b"NOT HTTP AT ALL\r\n\r\n")
            _, half = await _connect(port)
            half.write(b"POST /v1/completions HTTP/1.1\r\nContent-Le")
            leaver_reader, leaver = await _connect(port)
            leaver.write(_raw_request(random_tokens(seed=2, blocks=20), 320))
            await leaver_reader.readuntil(b"data: ")  # the stream has started
            leaver.close()

            counts = await asyncio.wait_for(
                asyncio.gather(*(_ordinary_stream(stack, 10 + i) for i in range(5))), 60
            )

            assert counts == [24] * 5
            handle = stack.handles[0]
            received = await asyncio.wait_for(slow_reader.readuntil(b"data: [DONE]\n\n"), 120)
            events = re.findall(rb"data: (\{.*?\})\n\n", received)  # between chunk sizes
            finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events]
            assert finishes == [None] * (LONG - 1) + ["length"]  # one per token, none lost
            for _ in range(200):
                if handle.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            assert handle.in_flight == 0  # the leaver's request was aborted, not leaked
            for writer in (slow, garbage, half):
                writer.close()

    asyncio.run(main())
