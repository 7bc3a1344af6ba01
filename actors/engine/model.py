"""A Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over a paged KV cache.

The numerics follow transformers' reference implementation (RMSNorm in float32, RoPE with
``rotate_half``, SDPA attention) so that greedy output matches it token for token. The
projections are fused (q|k|v and gate|up) to halve the matmul count per layer; tokens of
all sequences in a step are flattened into one ``[tokens, hidden]`` batch. Each layer
hands the next its MLP output and the residual apart, so that the residual add and the
next RMSNorm are one op (``fused_ops``: one kernel each on CUDA, plain torch on a CPU).

Skinny projections (``use_skinny_projections``, which the CUDA runner calls under
``EngineConfig.cuda_fast_paths``, on by default since 2026-12-01): at small batch on CUDA
every projection but the LM head goes through ``skinny_matmul`` (cuBLAS or a Triton
kernel, whichever its timing found faster; the Triton kernel takes the add + RMSNorm in
front of q|k|v and gate|up, and the SiLU·mul in front of down); at many rows (prefill,
batch 256) gate|up may take SiLU·mul in its epilogue (``gated_gemm``, where its timing
found it faster). Not called (a CPU, or the fast paths off), each layer runs the ops of
before, unchanged.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from dynask.actors.engine.attention import AttentionMetadata, paged_attention
from dynask.actors.engine.cuda import fused_ops, gated_gemm, skinny_matmul
from dynask.actors.engine.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_ops.add_rms_norm(x, None, self.weight, self.eps)[0]

    def add_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` (one kernel on CUDA)."""
        return fused_ops.add_rms_norm(x, residual, self.weight, self.eps)

    def add_norm_linear(
        self, x: torch.Tensor, residual: torch.Tensor | None, layer: nn.Linear
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(layer(norm(x + residual)), x + residual)``; at small batch on CUDA the norm
        may run inside the matmul (``skinny_matmul.norm_linear``; skinny path)."""
        return skinny_matmul.norm_linear(x, residual, self.weight, self.eps, layer)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin per position, indexed by each token's position."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        inv_freq, scaling = config.rope_inv_freq()
        positions = torch.arange(max_positions, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, window: int | None = None) -> None:
        super().__init__()
        self.window = window  # sliding window of this layer (None: full attention)
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        out = self.attend(self.qkv_proj(hidden), positions, rotary, kv_cache, meta)
        projected: torch.Tensor = self.o_proj(out.reshape(num_tokens, self.q_size))
        return projected

    def attend(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Attention ``[tokens, heads, dim]`` from the fused q|k|v projection's output."""
        num_tokens = qkv.shape[0]
        fused = self.q_norm is None and fused_ops.can_fuse_rotary(qkv, self.head_dim)
        if fused:  # RoPE in place in qkv, k and v into the cache: one kernel
            fused_ops.rotary_and_store(
                qkv, positions, rotary.cos, rotary.sin, kv_cache, meta.slot_mapping,
                self.num_heads, self.num_kv_heads,
            )  # fmt: skip
        q, k, v = torch.split(qkv, [self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if not fused:
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rotary(q, k, positions)
        return paged_attention(
            q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, not fused, self.window
        )


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(
            config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias
        )
        self.down_proj = nn.Linear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        down: torch.Tensor = self.down_proj(fused_ops.silu_and_mul(self.gate_up_proj(x)))
        return down

    def fast_forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(self(norm(x + residual)), x + residual)`` on the CUDA fast paths: at small
        batch the norm may run inside gate|up and SiLU·mul inside down
        (``skinny_matmul``); from 33 rows SiLU·mul inside gate|up (``gated_gemm``), where
        its start-up timing kept it."""
        tile = gated_gemm.tile_for(x, self.gate_up_proj)
        if tile is not None:
            normed, residual = norm.add_norm(x, residual)
            act = gated_gemm.launch(normed, self.gate_up_proj.weight, tile)
            return skinny_matmul.linear(act, self.down_proj), residual
        gate_up, residual = norm.add_norm_linear(x, residual, self.gate_up_proj)
        return skinny_matmul.gated_linear(gate_up, self.down_proj), residual


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        self.skinny_projections = False  # set by CausalLM.use_skinny_projections

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden`` is the previous layer's MLP output (the embeddings for the first
        layer, with ``residual`` None); returns this layer's MLP output and residual."""
        if self.skinny_projections:
            return self._skinny_forward(hidden, residual, positions, rotary, kv_cache, meta)
        normed, residual = self.input_layernorm.add_norm(hidden, residual)
        attn_out = self.self_attn(normed, positions, rotary, kv_cache, meta)
        normed, residual = self.post_attention_layernorm.add_norm(attn_out, residual)
        mlp_out: torch.Tensor = self.mlp(normed)
        return mlp_out, residual

    def _skinny_forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` with every projection through ``skinny_matmul`` (skinny path)."""
        attn = self.self_attn
        qkv, residual = self.input_layernorm.add_norm_linear(hidden, residual, attn.qkv_proj)
        attended = attn.attend(qkv, positions, rotary, kv_cache, meta)
        attn_out = skinny_matmul.linear(attended.reshape(qkv.shape[0], attn.q_size), attn.o_proj)
        return self.mlp.fast_forward(attn_out, residual, self.post_attention_layernorm)


class CausalLM(nn.Module):
    """The decoder stack plus the LM head; ``forward`` returns hidden states."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        windows = config.layer_windows or (None,) * config.num_layers
        self.layers = nn.ModuleList(DecoderLayer(config, w) for w in windows)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config, max_positions)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def use_skinny_projections(self) -> None:
        """Turns on the skinny fused projections (``skinny_matmul``). Only the model's
        runner calls it, on CUDA under ``EngineConfig.cuda_fast_paths``."""
        for layer in self.layers:
            cast(DecoderLayer, layer).skinny_projections = True

    def gate_up_proj(self, layer: int) -> nn.Linear:
        return cast(DecoderLayer, self.layers[layer]).mlp.gate_up_proj

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, positions, self.rotary, kv_cache, meta)
        normed, _ = self.norm.add_norm(hidden, residual)
        return normed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()
