"""Loading model weights and configs from an HF folder (``actors.models`` finds the folder).

Formats are read with well-kept libraries: transformers reads configs, safetensors reads
weights; a GGUF file was converted into an HF folder before (``actors.models``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from dynask.actors.engine.model import CausalLM
from dynask.actors.engine.model_config import ModelConfig
from dynask.actors.models.model_source import ModelSource


def load_hf_config(folder: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def eos_token_ids(folder: Path, config: ModelConfig, tokenizer: Any) -> tuple[int, ...]:
    """EOS ids from the config, generation_config.json and the tokenizer, merged."""
    ids = list(config.eos_token_ids)
    try:
        from transformers import GenerationConfig

        gen_eos = GenerationConfig.from_pretrained(folder).eos_token_id
    except OSError:
        gen_eos = None
    ids += [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


def load_model(
    source: ModelSource,
    config: ModelConfig,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
) -> CausalLM:
    """Builds the model and loads its weights onto ``device`` with a progress bar."""
    tensors = _read_safetensors(source.folder)
    return load_model_from_tensors(tensors, source.origin, config, max_positions, device, dtype)


def load_model_from_tensors(
    tensors: Iterator[tuple[str, torch.Tensor]],
    origin: str,
    config: ModelConfig,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
) -> CausalLM:
    """Builds the model from HF-named tensors (a checkpoint, or a live HF model's state).

    Tensors already on ``device`` in ``dtype`` are used as they are, not copied.
    """
    with torch.device("meta"):
        model = CausalLM(config, max_positions)
    state = dict(_fused_weights(tensors, config, device, dtype))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"weights in '{origin}' do not fit a {config.model_type} model: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    if device.type == "cpu" and dtype == torch.float32:
        _column_major_projections(model)
    with torch.device(device):
        model.rotary = type(model.rotary)(config, max_positions)
    return model.eval()


def _column_major_projections(model: CausalLM) -> None:
    """Stores every projection's weight column-major (a transposed copy, seen transposed).

    ``F.linear`` then hands BLAS an ``x @ W`` product instead of ``x @ W.T``. With one row
    (decoding a single sequence) MKL's matrix-vector kernel for the usual layout ran on one
    core at 16 GB/s here, against 24 GB/s for this layout: SmolLM2's decode step went from
    42 ms to about 31 ms. From 8 rows up both layouts take the same GEMM and give
    bit-identical results; with one or two rows the sums are ordered differently (last-bit
    differences against HF's ``F.linear``). A tied LM head gets its own copy: the
    embedding lookup keeps the row-major table. Float32 only: oneDNN's bf16 kernels are
    faster with the usual layout (10.6 vs 14.1 ms for SmolLM2's projections, one row).
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight.detach()
            module.weight = nn.Parameter(weight.t().contiguous().t(), requires_grad=False)


def _read_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    handles = [safe_open(str(f), framework="pt") for f in files]
    keys = [(h, k) for h in handles for k in h.keys()]  # type: ignore[no-untyped-call]  # noqa: SIM118
    for handle, key in tqdm(keys, desc="loading weights", unit="tensor", leave=False):
        yield key, handle.get_tensor(key)


_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _fused_weights(
    tensors: Iterator[tuple[str, torch.Tensor]],
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Renames HF weights to ours and concatenates q|k|v and gate|up."""
    pending: dict[str, dict[int, torch.Tensor]] = {}
    for hf_name, tensor in tensors:
        name = hf_name.removeprefix("model.")
        if name.startswith("lm_head") and config.tie_word_embeddings:
            continue
        tensor = tensor.to(device=device, dtype=dtype)
        parts = name.split(".")
        fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
        if fused is None:
            yield name, tensor
            continue
        target = ".".join([*parts[:-2], fused[0], parts[-1]])
        group = pending.setdefault(target, {})
        group[fused[1]] = tensor
        if len(group) == (3 if fused[0] == "qkv_proj" else 2):
            yield target, torch.cat([group[i] for i in sorted(group)], dim=0)
            del pending[target]
    if pending:
        raise ValueError(f"incomplete fused weights: {sorted(pending)[:5]}")
