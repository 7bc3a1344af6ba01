"""Incremental detokenization with stop strings.

Decoding one token at a time is wrong for byte-level and SentencePiece vocabularies: a
multi-byte character can span tokens and a leading space depends on the previous token.
So each step decodes a short window (``prefix_offset`` .. end) and emits only what the
window added beyond its already-emitted part, holding back while the text ends in an
incomplete character (U+FFFD). Stop strings are searched in the text produced so far;
text that could still turn into a stop string is held back until it cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT_TOKENS = 6  # prompt tail that gives the first output token its context


def ids_decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``tokenizer.decode`` of a list of ids, straight to the Rust ``tokenizers`` object of a
    fast HF tokenizer when that gives the same text (no space clean-up to apply).

    Every output token is decoded twice (the window and its prefix); transformers' Python
    wrapper around the Rust call (argument conversion, the clean-up check) cost ~5x the
    decode itself, ~2 ms a step at 256 rows on the H200's host (issue 19).
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    cleans_up = getattr(tokenizer, "clean_up_tokenization_spaces", True)
    if backend is not None and _is_rust_tokenizer(backend) and not cleans_up:
        decode = backend.decode

        def direct(tokens: list[int]) -> str:
            return str(decode(tokens, skip_special_tokens=skip_special_tokens))

        return direct

    def wrapped(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens))

    return wrapped


def _is_rust_tokenizer(backend: Any) -> bool:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - transformers' fast tokenizers need it
        return False
    return isinstance(backend, Tokenizer)


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        stop: tuple[str, ...] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._decode = ids_decoder(tokenizer, skip_special_tokens)
        self._tokens = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._stop = stop
        self.text = ""  # all output text so far (after stop truncation)
        self._emitted = 0  # how much of self.text has been handed out
        self.stopped_by: str | None = None

    def push(self, token_id: int) -> None:
        """Adds one output token; the new text becomes visible through ``take``."""
        self._tokens.append(token_id)
        prefix = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        window = self._decode(self._tokens[self._prefix_offset :])
        if len(window) <= len(prefix) or window.endswith(_REPLACEMENT):
            return  # no complete new character yet
        self.text += window[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)
        self._check_stop()

    def take(self, final: bool = False) -> str:
        """Returns the text not yet handed out, except a possible stop-string prefix."""
        end = len(self.text) if final or self.stopped_by else len(self.text) - self._held_back()
        delta = self.text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return delta

    def _check_stop(self) -> None:
        if not self._stop or self.stopped_by:
            return
        longest = max(len(s) for s in self._stop)
        search_from = max(0, self._emitted - longest)
        hits = [(self.text.find(s, search_from), s) for s in self._stop]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if hits:
            pos, stop = min(hits)
            self.text = self.text[:pos]
            self.stopped_by = stop

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:size]):
                    best = size
                    break
        return best
