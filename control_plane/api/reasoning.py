"""Reasoning output: ``<think>…</think>`` goes to ``reasoning_content``, the rest is content.

DeepSeek-R1 distills and Qwen3 write their reasoning between these tags. Some chat
templates open the block themselves (the generation prompt ends with ``<think>``): the
output then starts inside it, and only ``</think>`` is written. A tag split across deltas
is held until it is whole, so no piece of it reaches the client.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"
PARSERS = ("deepseek_r1", "qwen3", "think")  # one parser, under the names other servers use


@dataclass(frozen=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


def detect_reasoning(chat_template: str | None) -> bool:
    """True when the template knows ``<think>`` blocks (it strips them from history, or
    opens one in the generation prompt)."""
    return CLOSE in (chat_template or "") or OPEN in (chat_template or "")


def check_parser_name(name: str) -> str:
    if name not in (*PARSERS, "none"):
        raise ValueError(
            f"reasoning parser '{name}' is not known; valid: {', '.join(PARSERS)}, none"
        )
    return name


class ReasoningStream:
    """Splits one choice's output into reasoning and content."""

    def __init__(self, prompt_opens_block: bool = False) -> None:
        self._state = "reasoning" if prompt_opens_block else "start"
        self._held = ""

    def feed(self, text: str) -> ReasoningDelta:
        self._held += text
        if self._state == "start":
            stripped = self._held.lstrip()
            if not stripped or (OPEN.startswith(stripped) and stripped != OPEN):
                return ReasoningDelta()  # it may still become <think>
            if stripped.startswith(OPEN):
                self._held = stripped[len(OPEN) :]
                self._state = "reasoning"
            else:
                self._state = "content"
        if self._state == "reasoning":
            at = self._held.find(CLOSE)
            if at >= 0:
                reasoning, rest = self._held[:at], self._held[at + len(CLOSE) :]
                self._held, self._state = "", "after"
                return ReasoningDelta(reasoning=reasoning, content=rest.lstrip())
            keep = _prefix_kept(self._held, CLOSE)
            reasoning = self._held[: len(self._held) - keep]
            self._held = self._held[len(self._held) - keep :]
            return ReasoningDelta(reasoning=reasoning)
        content = self._held
        if self._state == "after":
            if not content.strip():
                return ReasoningDelta()  # the whitespace right after </think> is dropped
            content, self._state = content.lstrip(), "content"
        self._held = ""
        return ReasoningDelta(content=content)

    def finish(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return ReasoningDelta(reasoning=held)  # the model never closed its block
        return ReasoningDelta(content="" if self._state == "after" else held)


def prompt_opens_block(prompt_text: str) -> bool:
    return prompt_text.rstrip().endswith(OPEN)


def _prefix_kept(text: str, tag: str) -> int:
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
