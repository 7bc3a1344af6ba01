"""``in=text``: an interactive chat with the model in the terminal."""

from __future__ import annotations

import asyncio
import sys
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
        line = await asyncio.to_thread(stdin.readline)
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
