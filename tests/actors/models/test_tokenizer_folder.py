"""``load_tokenizer`` reads a ``TokenizersBackend`` folder directly (no torch) and gives
what ``AutoTokenizer`` gives: the same class, ids, special tokens and chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from dynask.actors.models import tokenizer_folder
from dynask.actors.models.tokenizer_folder import load_tokenizer

TEXT = "Hello world <|im_end|> and ünïcode 123"
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.mark.parametrize("fixture", ["tiny_llama_folder", "smollm2_folder"])
def test_a_fast_tokenizer_folder_loads_as_auto_tokenizer_loads_it(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    folder: Path = request.getfixturevalue(fixture)
    assert tokenizer_folder._is_plain_fast_tokenizer(folder)
    ours, auto = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert type(ours) is type(auto)
    assert ours(TEXT)["input_ids"] == auto(TEXT)["input_ids"]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        auto.bos_token_id,
        auto.eos_token_id,
        auto.pad_token_id,
    )
    assert ours.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert len(ours) == len(auto)


def test_another_tokenizer_class_or_remote_code_goes_through_auto_tokenizer(
    tiny_llama_folder: Path, tmp_path: Path
) -> None:
    for name, change in (("named", {"tokenizer_class": "LlamaTokenizer"}), ("remote", {})):
        folder = Path(shutil.copytree(tiny_llama_folder, tmp_path / name))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.update(change)
        if name == "remote":
            config["auto_map"] = {"AutoTokenizer": ["x.Tok", None]}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        assert not tokenizer_folder._is_plain_fast_tokenizer(folder)
    (tmp_path / "bare").mkdir()
    assert not tokenizer_folder._is_plain_fast_tokenizer(tmp_path / "bare")
