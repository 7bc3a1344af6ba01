"""Token logprobs in OpenAI's two shapes: chat (``content`` entries) and completions.

A token's text is its own bytes, decoded with replacement: a token holding half of a
multi-byte character shows as ``\\ufffd`` while its ``bytes`` are exact, so the bytes of
a choice's tokens always join into its text (OpenAI's reason for the field). Byte-level
BPE tokenizers (GPT-2, Llama 3, Qwen, SmolLM2) map every byte to one printable character;
``TokenTexts`` inverts that map. Other tokenizers fall back to the token decoded alone.
Special tokens the output skips (EOS) have empty text.
"""

from __future__ import annotations

from typing import Any

from dynask.actors.api.outputs import TokenLogprob


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character map, inverted: printable Latin-1 bytes stand for
    themselves, the other 68 bytes for the code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return {c: b for b, c in chars.items()}


class TokenTexts:
    """Token id -> (text, bytes) for one tokenizer, cached per id."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._skip: set[int] | None = None  # read on first use: most requests never ask
        self._alphabet: dict[str, int] | None = None
        self._cache: dict[int, tuple[str, bytes]] = {}

    def _load(self) -> set[int]:
        tokenizer = self._tokenizer
        special = set(tokenizer.all_special_ids) if self._skip_special_tokens else set()
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        if type(decoder).__name__ == "ByteLevel":
            self._alphabet = _byte_level_alphabet()
        self._skip = special
        return special

    def get(self, token_id: int, chosen: bool = True) -> tuple[str, bytes]:
        """Text and bytes of a token; a skipped special token is empty when ``chosen``
        (it is not in the output text) and named otherwise (a top alternative)."""
        skip = self._skip if self._skip is not None else self._load()
        if chosen and token_id in skip:
            return "", b""
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._lookup(token_id)
        return found

    def _lookup(self, token_id: int) -> tuple[str, bytes]:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        alphabet = self._alphabet
        if alphabet is not None and isinstance(piece, str) and all(c in alphabet for c in piece):
            raw = bytes(alphabet[c] for c in piece)
            return raw.decode("utf-8", errors="replace"), raw
        text = str(self._tokenizer.decode([token_id]))
        return text, text.encode("utf-8")


def chat_logprobs(logprobs: tuple[TokenLogprob, ...], texts: TokenTexts) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat completion (or a chunk's share of it)."""
    return {"content": [_chat_entry(lp, texts) for lp in logprobs]}


def _chat_entry(logprob: TokenLogprob, texts: TokenTexts) -> dict[str, Any]:
    text, raw = texts.get(logprob.token_id)
    top = []
    for token_id, value in logprob.top:
        alt_text, alt_raw = texts.get(token_id, chosen=False)
        top.append({"token": alt_text, "logprob": value, "bytes": list(alt_raw)})
    return {"token": text, "logprob": logprob.logprob, "bytes": list(raw), "top_logprobs": top}


def completion_logprobs(
    logprobs: tuple[TokenLogprob, ...], texts: TokenTexts, offset: int
) -> dict[str, Any]:
    """``choices[].logprobs`` of a completion; ``offset`` is where the first token's text
    starts in the choice's text (after an echoed prompt, after earlier chunks)."""
    tokens, values, tops, offsets = [], [], [], []
    for logprob in logprobs:
        text, _ = texts.get(logprob.token_id)
        tokens.append(text)
        values.append(logprob.logprob)
        tops.append({texts.get(t, chosen=False)[0]: v for t, v in logprob.top})
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
