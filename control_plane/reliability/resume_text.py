"""Text across a migration point: what the lost engine held back, and stop strings that
straddle the point.

An engine holds back text that could still become a stop string: a token whose text is
``"xa"`` with the stop string ``"ab"`` shows ``"x"`` and keeps ``"a"``. The token went out
(its delta carried text), so the resumed request has it in its prompt, and the new engine
would never show the ``"a"`` nor see the ``"ab"``. ``held_back_text`` rebuilds that text
with the model's tokenizer (the control plane has it for chat templates); ``StopCarry``
prepends it to the resumed attempt's text and ends the request at a stop string that
begins before the migration point.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage

_CONTEXT_TOKENS = 6  # prompt tail decoded with the output (a leading space needs context)
_REPLACEMENT = "\ufffd"


def held_back_text(
    tokenizer: Any,
    prompt_ids: list[int],
    output_ids: list[int],
    shown_text: str,
    skip_special_tokens: bool = True,
) -> str:
    """The text of ``output_ids`` beyond ``shown_text`` (what the client saw of them).

    Empty when the decoded text does not extend what was shown (an incomplete character
    at the end, or a tokenizer whose decoding depends on more context): nothing is added
    rather than something wrong.
    """
    context = prompt_ids[-_CONTEXT_TOKENS:]
    before = str(tokenizer.decode(context, skip_special_tokens=skip_special_tokens))
    whole = str(tokenizer.decode(context + output_ids, skip_special_tokens=skip_special_tokens))
    if not whole.startswith(before):
        return ""
    text = whole[len(before) :]
    if text.endswith(_REPLACEMENT) or not text.startswith(shown_text):
        return ""
    return text[len(shown_text) :]


class StopCarry:
    """Joins held-back text with a resumed attempt's deltas and finds straddling stops."""

    def __init__(self, held: str, stops: tuple[str, ...]) -> None:
        self._pending = held  # text not handed out yet
        self._stops = stops

    def apply(self, output: RequestOutput, usage: Usage) -> RequestOutput:
        """``output`` with the pending text before its own; the request's final delta
        (finish reason ``stop``, ``usage``) if a stop string begins in the pending text."""
        text = self._pending + output.text
        hits = [(text.find(stop), stop) for stop in self._stops]
        hits = [(pos, stop) for pos, stop in hits if pos >= 0]
        if hits:
            pos, stop = min(hits)
            self._pending = ""
            return dataclasses.replace(
                output,
                text=text[:pos],
                finish_reason=FinishReason.STOP,
                stop_reason=stop,
                usage=output.usage or usage,
            )
        keep = 0 if output.finished else _stop_prefix_length(text, self._stops)
        self._pending = text[len(text) - keep :]
        return dataclasses.replace(output, text=text[: len(text) - keep])


def _stop_prefix_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:size]):
                best = size
                break
    return best
