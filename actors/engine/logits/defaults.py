"""What a request that leaves sampling fields out gets: the model's, then OpenAI's.

As vLLM does, a model folder's ``generation_config.json`` supplies ``temperature``,
``top_p``, ``top_k`` and ``repetition_penalty``; whatever it leaves out falls back to
``SamplingParams``' own defaults (OpenAI's: temperature 1, top_p 1). The bundled
SmolLM2-135M-Instruct ships no generation config, and at temperature 1 it drifts off
topic within a sentence, so it gets ``BUNDLED_MODEL_DEFAULTS``, chosen by
``bench.engine.sampling_defaults`` (the numbers are in the README).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")
BUNDLED_MODEL_DEFAULTS: dict[str, Any] = {"temperature": 0.2, "top_p": 0.9}


def sampling_defaults(folder: Path, bundled: bool) -> dict[str, Any]:
    """The ``SamplingParams`` keywords a model's requests start from."""
    if bundled:
        return dict(BUNDLED_MODEL_DEFAULTS)
    path = folder / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s, which cannot be read: %s", path, exc)
        return {}
    if not isinstance(config, dict):
        return {}
    return {
        key: config[key]
        for key in GENERATION_CONFIG_KEYS
        if isinstance(config.get(key), (int, float)) and not isinstance(config.get(key), bool)
    }
