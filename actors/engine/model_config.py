"""The architecture description of a Llama-family model, read from a transformers config.

One small dataclass instead of passing the transformers config around: the engine only
needs these numbers, and checking them here gives a clear error for an unsupported model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/3)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    hf_config: Any  # the transformers config, kept for the RoPE helpers
    # Per layer: None = full attention, W = sliding window (a token sees the last W
    # positions, itself included), as Mistral and windowed Qwen2 layers do.
    layer_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported by the built-in engine; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """Reads a transformers ``PretrainedConfig`` of a supported model type."""
        num_heads = int(hf.num_attention_heads)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
        model_type = str(hf.model_type)
        return cls(
            model_type=model_type,
            vocab_size=int(hf.vocab_size),
            hidden_size=int(hf.hidden_size),
            intermediate_size=int(hf.intermediate_size),
            num_layers=int(hf.num_hidden_layers),
            num_heads=num_heads,
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.rms_norm_eps),
            max_position_embeddings=int(hf.max_position_embeddings),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(getattr(hf, "attention_bias", False)),
            o_bias=bool(getattr(hf, "attention_bias", False)) and model_type != "qwen2",
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            eos_token_ids=_eos_ids(hf),
            hf_config=hf,
            layer_windows=_layer_windows(hf, int(hf.num_hidden_layers)),
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of K and V cache one token takes across all layers."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    def rope_inv_freq(self) -> tuple[torch.Tensor, float]:
        """Inverse frequencies and the attention scaling of this model's RoPE.

        Uses transformers' own RoPE initialisers so that scaled variants (llama3, yarn,
        linear) match the reference implementation exactly.
        """
        params = _rope_parameters(self.hf_config)
        rope_type = params.get("rope_type", "default")
        if rope_type not in _STATIC_ROPE_TYPES:
            raise ValueError(
                f"rope_type {rope_type!r} is not supported by the built-in engine; "
                f"supported: {', '.join(_STATIC_ROPE_TYPES)}"
            )
        if rope_type == "default":
            base = float(params["rope_theta"])
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim
            return 1.0 / (base**exponents), 1.0
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](self.hf_config)
        return inv_freq.float(), float(scaling)


def _rope_parameters(hf: Any) -> dict[str, Any]:
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return params
    return {"rope_type": "default", "rope_theta": float(getattr(hf, "rope_theta", 10000.0))}


def _layer_windows(hf: Any, num_layers: int) -> tuple[int | None, ...]:
    """Which layers attend through a sliding window (transformers' ``layer_types`` when
    the config has them; a window without them, as Mistral's, covers every layer)."""
    window = getattr(hf, "sliding_window", None)
    if not window:
        return (None,) * num_layers
    types = getattr(hf, "layer_types", None)
    if types:
        return tuple(int(window) if kind == "sliding_attention" else None for kind in types)
    return (int(window),) * num_layers


def _eos_ids(hf: Any) -> tuple[int, ...]:
    eos = getattr(hf, "eos_token_id", None)
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(e) for e in eos)
