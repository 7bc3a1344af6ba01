"""``in=text``: an interactive chat with the model in the terminal."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.engine import LLMEngine

PROMPT = "you> "
EXIT_WORDS = ("exit", "quit", "/bye")


def run_text_chat(
    engine: LLMEngine,
    params: SamplingParams,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Reads a line, streams the reply, keeps the conversation; ends on EOF or 'exit'."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    history: list[dict[str, Any]] = []
    stdout.write("Chat with the model. Type 'exit' or press Ctrl-D to leave.\n")
    while True:
        stdout.write(PROMPT)
        stdout.flush()
        line = stdin.readline()
        if not line or line.strip() in EXIT_WORDS:
            stdout.write("\n")
            return 0
        if not line.strip():
            continue
        history.append({"role": "user", "content": line.strip()})
        stdout.write("model> ")
        reply = []
        for text in engine.iter_text(engine.apply_chat_template(history), params):
            reply.append(text)
            stdout.write(text)
            stdout.flush()
        stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})
