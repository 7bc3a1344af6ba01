"""The floors of a decode step (bench/engine/floors.py), worked out by hand on a tiny shape."""

from __future__ import annotations

import pytest

from bench.engine.floors import DecodeShape, decode_floors, decode_ops, prefill_flops

# hidden 4, 2 layers, 2 query heads and 1 KV head of dim 2, intermediate 8, vocab 10, bf16.
SHAPE = DecodeShape(
    hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, head_dim=2, vocab=10, dtype_bytes=2
)


def test_ops_count_weights_activations_kv_and_flops() -> None:
    ops = {op.name: op for op in decode_ops(SHAPE, batch=3, context=5)}

    # qkv: 4 -> 4 + 2 * 2 = 8 columns; weights 4*8*2 B, activations 3*(4+8)*2 B.
    assert (ops["qkv"].weight_bytes, ops["qkv"].other_bytes, ops["qkv"].flops) == (64, 72, 192)
    # attention: KV of 3 rows x 5 tokens x (k, v) x 2 dims x 2 B = 120 B, plus q and out.
    attention = ops["attention"]
    assert (attention.weight_bytes, attention.other_bytes, attention.flops) == (0, 168, 240)
    assert (ops["gate_up"].weight_bytes, ops["gate_up"].flops) == (128, 384)
    assert (ops["lm_head"].count, ops["lm_head"].weight_bytes) == (1, 80)


def test_memory_floor_and_roofline() -> None:
    memory_bound = decode_floors(SHAPE, batch=3, context=5, bandwidth=10.0, matmul_rate=100.0)

    assert (memory_bound.weight_bytes, memory_bound.kv_bytes) == (656, 240)
    assert memory_bound.memory_floor_s == pytest.approx((656 + 240) / 10)
    # Every op is memory-bound here: its weights and other bytes over the bandwidth.
    assert memory_bound.roofline_s == pytest.approx(170.0)

    compute_bound = decode_floors(SHAPE, batch=3, context=5, bandwidth=1e12, matmul_rate=10.0)
    assert compute_bound.flops == 2448
    assert compute_bound.roofline_s == pytest.approx(2448 / 10.0)
    assert compute_bound.roofline_s > compute_bound.memory_floor_s


def test_prefill_flops_count_projections_causal_attention_and_one_lm_head_row() -> None:
    # per token: qkv 4*8 + o 4*4 + gate/up/down 3*4*8 = 144 MACs a layer, 2 FLOPs each,
    # 3 tokens, 2 layers = 1728; attention 4 * 4 (q dims) * 6 pairs * 2 layers = 192;
    # the LM head for the last token 2 * 4 * 10 = 80.
    assert prefill_flops(SHAPE, 3) == 1728 + 192 + 80
    llama_8b = DecodeShape(4096, 14336, 32, 32, 8, 128, 128256)
    assert prefill_flops(llama_8b, 8192) == pytest.approx(1.31945e14, rel=1e-5)
