"""Loading a tokenizer from an HF folder without loading torch.

transformers' ``AutoTokenizer`` imports its configuration module, which imports torch
(seconds per process, tens of seconds on a loaded host), although a tokenizer needs none of
it. A folder whose ``tokenizer_config.json`` names ``TokenizersBackend`` (what transformers
writes when it saves a fast tokenizer, as the GGUF conversion and the actors'
``save_pretrained`` do) and has no remote code is read by that class directly, which is
what ``AutoTokenizer`` would pick for it; any other folder goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The class transformers (5.x) writes for a fast tokenizer; AutoTokenizer maps it to itself.
_FAST_CLASS = "TokenizersBackend"


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer saved in ``folder`` (an HF model folder or a tokenizer's files)."""
    if _is_plain_fast_tokenizer(folder):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _is_plain_fast_tokenizer(folder: Path) -> bool:
    config_file = folder / "tokenizer_config.json"
    if not (config_file.is_file() and (folder / "tokenizer.json").is_file()):
        return False
    config = json.loads(config_file.read_text())
    return config.get("tokenizer_class") == _FAST_CLASS and "auto_map" not in config
