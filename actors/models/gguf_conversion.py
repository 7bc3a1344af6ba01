"""A GGUF file dequantized into a plain HF folder (``model_source.convert_gguf`` caches it).

transformers reads the GGUF file (dequantizing at load), safetensors writes the weights.
torch and transformers' model code are imported here only when a conversion runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def write_hf_folder(path: Path, out: Path) -> None:
    """Dequantizes the GGUF file ``path`` into an HF folder at ``out``: config, tokenizer,
    ``model.safetensors``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(path.parent), path.name
    hf_config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)  # type: ignore[no-untyped-call]
    read = load_gguf_checkpoint  # transformers leaves it untyped
    checkpoint: dict[str, Any] = read(str(path), return_tensors=True, model_to_load=skeleton)  # type: ignore[no-untyped-call]
    tensors: dict[str, torch.Tensor] = checkpoint["tensors"]
    if hf_config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    hf_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
