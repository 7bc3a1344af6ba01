"""The fused Triton ops against the plain torch ops they replace (same rounding points).

GPU only, or Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, float32 only);
skipped otherwise. Inputs are made contiguous copies so the torch path is forced by
running the same function on a CPU tensor.
"""

from __future__ import annotations

import pytest
import torch

from dynask.actors.engine.cuda import fused_ops
from dynask.actors.engine.model_config import ModelConfig
from tests.actors.engine.test_paged_kernels import _kernel_device


def _dtypes(device: torch.device) -> list[torch.dtype]:
    return [torch.float32] if device.type == "cpu" else [torch.float32, torch.bfloat16]


def _fused_device(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    if device.type == "cpu":  # under the interpreter: let the CPU tensors take the kernels
        monkeypatch.setattr(fused_ops, "_fused", lambda x: x.is_contiguous())


def test_add_rms_norm_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    device = _kernel_device()
    for dtype in _dtypes(device):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn((5, 96), generator=generator).to(dtype)
        residual = torch.randn((5, 96), generator=generator).to(dtype)
        weight = torch.randn(96, generator=generator).to(dtype)
        expected = [fused_ops.add_rms_norm(x, r, weight, 1e-6) for r in (None, residual)]
        _fused_device(device, monkeypatch)
        got = [
            fused_ops.add_rms_norm(x.to(device), r, weight.to(device), 1e-6)
            for r in (None, residual.to(device))
        ]
        monkeypatch.undo()
        for (norm, summed), (want_norm, want_sum) in zip(got, expected, strict=True):
            torch.testing.assert_close(summed.cpu(), want_sum, atol=0, rtol=0)
            tolerance = 1e-5 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(norm.cpu(), want_norm, atol=tolerance, rtol=tolerance)


def test_silu_and_mul_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    device = _kernel_device()
    for dtype in _dtypes(device):
        gate_up = torch.randn((3, 2 * 1500), generator=torch.Generator().manual_seed(1)).to(dtype)
        expected = fused_ops.silu_and_mul(gate_up)
        _fused_device(device, monkeypatch)
        got = fused_ops.silu_and_mul(gate_up.to(device))
        monkeypatch.undo()
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.cpu(), expected, atol=tolerance, rtol=tolerance)


def test_rotary_and_store_matches_torch_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import LlamaConfig

    from dynask.actors.engine.model import RotaryEmbedding

    device = _kernel_device()
    heads, kv_heads, dim = 6, 2, 32
    config = ModelConfig.from_hf(
        LlamaConfig(hidden_size=heads * dim, num_attention_heads=heads,
                    num_key_value_heads=kv_heads, vocab_size=10)
    )  # fmt: skip
    rotary = RotaryEmbedding(config, 64)
    generator = torch.Generator().manual_seed(2)
    qkv = torch.randn((4, (heads + 2 * kv_heads) * dim), generator=generator)
    positions = torch.tensor([0, 5, 17, 63])
    slots = torch.tensor([3, 0, 9, 4])
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    want_q, want_k = rotary(q.view(4, heads, dim), k.view(4, kv_heads, dim), positions)
    caches = (torch.zeros((3, 4, kv_heads, dim)), torch.zeros((3, 4, kv_heads, dim)))
    caches = (caches[0].to(device), caches[1].to(device))
    fused = qkv.to(device)
    _fused_device(device, monkeypatch)
    fused_ops.rotary_and_store(
        fused, positions.to(device), rotary.cos.to(device), rotary.sin.to(device), caches,
        slots.to(device), heads, kv_heads,
    )  # fmt: skip
    monkeypatch.undo()

    got_q, got_k, got_v = fused.cpu().split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    torch.testing.assert_close(got_q.view(4, heads, dim), want_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_k.view(4, kv_heads, dim), want_k, atol=1e-6, rtol=1e-6)
    k_slots = caches[0].cpu().flatten(0, 1)[slots]
    v_slots = caches[1].cpu().flatten(0, 1)[slots]
    torch.testing.assert_close(k_slots, want_k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(v_slots, v.reshape(4, kv_heads, dim), atol=0, rtol=0)
    assert torch.equal(got_v, v)
