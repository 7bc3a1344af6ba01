"""Token texts and bytes of logprobs entries, and the two OpenAI shapes, exactly."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from dynask.actors.api.outputs import TokenLogprob
from dynask.control_plane.api.sampling.logprobs_format import (
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
)

TEXT = "Café 龘 naïve"


def test_token_bytes_join_into_the_text_even_mid_character(tokenizer_folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    ids = tokenizer.encode(TEXT)
    texts = TokenTexts(tokenizer)
    pieces = [texts.get(i) for i in ids]
    assert b"".join(raw for _, raw in pieces).decode() == TEXT
    # 龘 (three bytes) is split over byte-level tokens: alone, they are not text.
    assert any(text == "\ufffd" or "\ufffd" in text for text, _ in pieces)
    assert all(text == raw.decode("utf-8", errors="replace") for text, raw in pieces)


def test_a_skipped_special_token_is_empty_when_chosen(tokenizer_folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    eos = tokenizer.eos_token_id
    texts = TokenTexts(tokenizer)
    assert texts.get(eos) == ("", b"")
    assert texts.get(eos, chosen=False)[0] == tokenizer.convert_ids_to_tokens(eos)


def test_the_chat_and_completion_shapes(tokenizer_folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    hello, world = tokenizer.encode("Hello world")
    texts = TokenTexts(tokenizer)
    logprobs = (
        TokenLogprob(hello, -0.5, ((hello, -0.5), (world, -1.5))),
        TokenLogprob(world, -0.25, ((world, -0.25),)),
    )
    assert chat_logprobs(logprobs, texts) == {
        "content": [
            {
                "token": "Hello",
                "logprob": -0.5,
                "bytes": list(b"Hello"),
                "top_logprobs": [
                    {"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello")},
                    {"token": " world", "logprob": -1.5, "bytes": list(b" world")},
                ],
            },
            {
                "token": " world",
                "logprob": -0.25,
                "bytes": list(b" world"),
                "top_logprobs": [{"token": " world", "logprob": -0.25, "bytes": list(b" world")}],
            },
        ]
    }
    assert completion_logprobs(logprobs, texts, offset=3) == {
        "tokens": ["Hello", " world"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"Hello": -0.5, " world": -1.5}, {" world": -0.25}],
        "text_offset": [3, 8],
    }
