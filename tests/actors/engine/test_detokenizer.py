"""Incremental detokenization: multi-byte characters and stop strings across tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynask.actors.engine.detokenizer import IncrementalDetokenizer

TEXT = "Grüße aus Köln — 日本語のテキスト 🙂👍🏽 done"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_folder)


def _stream(tokenizer: Any, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], Any]:
    prompt = tokenizer.encode("Say something:")
    detok = IncrementalDetokenizer(tokenizer, prompt, stop=stop)
    deltas = []
    for token in tokenizer.encode(text):
        detok.push(token)
        deltas.append(detok.take())
        if detok.stopped_by:
            break
    deltas.append(detok.take(final=True))
    return deltas, detok


def test_multibyte_characters_split_across_tokens_stream_intact(tokenizer: Any) -> None:
    tokens = tokenizer.encode(TEXT)
    # The premise: at least one character needs several byte-level tokens.
    pieces = [tokenizer.decode([t]) for t in tokens]
    assert any("\ufffd" in piece for piece in pieces)

    deltas, _ = _stream(tokenizer, TEXT)

    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in delta for delta in deltas)
    assert "" in deltas  # some steps had to wait for the rest of a character


def test_stop_string_split_across_tokens_is_cut_and_never_emitted(tokenizer: Any) -> None:
    deltas, detok = _stream(tokenizer, TEXT, stop=("テキスト",))

    assert "".join(deltas) == "Grüße aus Köln — 日本語の"
    assert detok.stopped_by == "テキスト"
    assert all("テ" not in delta for delta in deltas)


def test_partial_stop_prefix_is_released_when_it_does_not_complete(tokenizer: Any) -> None:
    deltas, detok = _stream(tokenizer, "a stop? no, a stoplight", stop=("stop!",))

    assert detok.stopped_by is None
    assert "".join(deltas) == "a stop? no, a stoplight"


@pytest.mark.parametrize("skip_special", [True, False])
def test_the_direct_decoder_gives_the_tokenizers_own_text(
    tokenizer: Any, skip_special: bool
) -> None:
    import random

    from dynask.actors.engine.detokenizer import ids_decoder

    assert not tokenizer.clean_up_tokenization_spaces  # SmolLM2's: the direct path applies
    decode = ids_decoder(tokenizer, skip_special)
    assert decode.__name__ == "direct"
    draw = random.Random(7)
    special = list(tokenizer.all_special_ids)
    for _ in range(200):
        ids = [draw.randrange(tokenizer.vocab_size) for _ in range(draw.randrange(1, 12))]
        ids.insert(draw.randrange(len(ids) + 1), draw.choice(special))
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=skip_special)


def test_a_tokenizer_that_cleans_up_spaces_keeps_its_own_decode(tokenizer: Any) -> None:
    from dynask.actors.engine.detokenizer import ids_decoder

    class CleaningUp:
        _tokenizer = tokenizer._tokenizer
        clean_up_tokenization_spaces = True

        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            return "cleaned:" + tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    decode = ids_decoder(CleaningUp(), True)
    assert decode.__name__ == "wrapped"
    assert decode(tokenizer.encode("a . b")) == "cleaned:a . b"
