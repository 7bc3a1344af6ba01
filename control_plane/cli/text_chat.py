"""``in=text``: an interactive chat with the model in the terminal."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from typing import Any, TextIO

from dynask.control_plane.cli.local_pipeline import LocalPipeline
from dynask.control_plane.serving.errors import ServingError

PROMPT = "you> "
EXIT_WORDS = ("exit", "quit", "/bye")


async def run_text_chat(
    pipeline: LocalPipeline, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """Reads a line, streams the reply, keeps the conversation; ends on EOF or 'exit'.
    A request the pipeline refuses is reported and the chat goes on."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    history: list[dict[str, Any]] = []
    stdout.write("Chat with the model. Type 'exit' or press Ctrl-D to leave.\n")
    while True:
        stdout.write(PROMPT)
        stdout.flush()
        line = await _read_line(stdin)
        if not line or line.strip() in EXIT_WORDS:
            stdout.write("\n")
            return 0
        if not line.strip():
            continue
        history.append({"role": "user", "content": line.strip()})
        stdout.write("model> ")
        reply = []
        try:
            async for output in pipeline.stream(pipeline.request(messages=history)):
                reply.append(output.text)
                stdout.write(output.text)
                stdout.flush()
        except ServingError as exc:
            history.pop()
            stdout.write(f"\n[error: {exc.message}]\n")
            continue
        stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})


async def _read_line(stdin: TextIO) -> str:
    """The next line, read in a daemon thread: Ctrl-C while waiting for input must not
    leave the process waiting for a thread stuck in ``readline`` (as the default
    executor's would, at shutdown)."""
    loop = asyncio.get_running_loop()
    line: asyncio.Future[str] = loop.create_future()

    def read() -> None:
        text = stdin.readline()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(_settle, line, text)

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return await line


def _settle(future: asyncio.Future[str], text: str) -> None:
    if not future.done():
        future.set_result(text)
