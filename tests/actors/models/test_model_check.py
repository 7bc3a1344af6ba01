"""What a model argument names, read alike by the admin UI's check (``model_problem``)
and by the engines' loader (``resolve_model``): a folder, a .gguf file, or a hub id."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynask.actors.models.model_check import model_problem, names_a_path
from dynask.actors.models.model_source import ModelNotFoundError, resolve_model


@pytest.mark.parametrize(
    ("model", "is_path"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", False),
        ("Qwen/Qwen2.5-0.5B", False),
        ("./tiny", True),
        ("/models/llama", True),
        ("~/models/llama", True),
        ("llama.gguf", True),
        ("org/model.gguf", True),
        ("models/llama/8b", True),  # two slashes: a relative path
        ("llama", True),  # no owner
        ("my org/llama", True),  # a hub id has no spaces
    ],
)
def test_a_model_argument_names_a_path_or_a_hub_id(model: str, is_path: bool) -> None:
    assert names_a_path(model) is is_path


def test_the_check_and_the_loader_refuse_the_same_folders(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert model_problem(str(tmp_path)) == (
        f"the folder '{tmp_path}' has no *.safetensors weights (other formats are not read)"
    )
    with pytest.raises(ModelNotFoundError) as raised:
        resolve_model(tmp_path)
    assert str(raised.value) == (
        f"model folder '{tmp_path}' has no *.safetensors weights (other formats are not read)"
    )


def test_a_name_with_a_space_is_a_missing_path_not_a_hub_download() -> None:
    assert model_problem("my org/llama") == (
        "'my org/llama' is neither an existing folder or .gguf file nor a hub id such as "
        "'HuggingFaceTB/SmolLM2-135M-Instruct'"
    )
    with pytest.raises(ModelNotFoundError, match="model path 'my org/llama' does not exist"):
        resolve_model("my org/llama")
