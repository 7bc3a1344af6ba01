"""Defaults for omitted sampling fields: a model's generation_config.json, or ours for
the bundled model."""

from __future__ import annotations

import json
from pathlib import Path

from dynask.actors.engine.logits.defaults import BUNDLED_MODEL_DEFAULTS, sampling_defaults


def test_the_generation_config_supplies_what_it_sets(tmp_path: Path) -> None:
    config = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "do_sample": True, "max_new_tokens": 5}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    assert sampling_defaults(tmp_path, bundled=False) == {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
    }


def test_no_or_broken_generation_config_gives_none(tmp_path: Path) -> None:
    assert sampling_defaults(tmp_path, bundled=False) == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    assert sampling_defaults(tmp_path, bundled=False) == {}
    (tmp_path / "generation_config.json").write_text('{"temperature": "hot", "top_p": true}')
    assert sampling_defaults(tmp_path, bundled=False) == {}


def test_the_bundled_model_gets_the_documented_defaults(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"temperature": 1.5}')
    assert sampling_defaults(tmp_path, bundled=True) == BUNDLED_MODEL_DEFAULTS
