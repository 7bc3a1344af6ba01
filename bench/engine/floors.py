"""Two floors of a decode step: the memory floor and the roofline.

A decode step of ``batch`` rows at a mean context of ``context`` tokens runs, per layer,
the fused QKV projection, attention over the paged KV cache, the output projection, the
fused gate/up projection and the down projection, then the LM head once (norms, RoPE
and the activation are elementwise over a few ``batch x hidden`` tensors: their bytes are
counted with the op they follow, their FLOPs are negligible).

* **Memory floor**: the bytes a step must read — every weight but the embedding table,
  plus the KV of every row's context — over the copy bandwidth measured in the same run.
* **Roofline**: per op the larger of its bytes over the bandwidth and its FLOPs over the
  bf16 matrix rate measured in the same run, summed. At a large batch the projections are
  compute-bound, so the memory floor alone is too optimistic there.

Both take the model shape from ``ModelConfig`` numbers, so they are exact arithmetic
(``tests/test_bench_floors.py`` checks them by hand on a small shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from dynask.actors.engine.model_config import ModelConfig


@dataclass(frozen=True)
class DecodeShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2

    @classmethod
    def of(cls, config: ModelConfig, dtype_bytes: int) -> DecodeShape:
        """From the engine's model config."""
        return cls(
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            layers=config.num_layers,
            heads=config.num_heads,
            kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            vocab=config.vocab_size,
            dtype_bytes=dtype_bytes,
        )


@dataclass(frozen=True)
class Op:
    name: str
    count: int  # how many times a step runs it (layers; 1 for the LM head)
    weight_bytes: int
    other_bytes: int  # KV read, activations read and written
    flops: int

    def seconds(self, bandwidth: float, matmul_rate: float) -> float:
        """This op's roofline time for all ``count`` runs."""
        memory = (self.weight_bytes + self.other_bytes) / bandwidth
        return self.count * max(memory, self.flops / matmul_rate)


def _matmul(name: str, count: int, batch: int, k: int, n: int, b: int) -> Op:
    return Op(name, count, k * n * b, batch * (k + n) * b, 2 * batch * k * n)


def decode_ops(shape: DecodeShape, batch: int, context: float) -> list[Op]:
    """The ops of one decode step of ``batch`` rows at a mean ``context`` (tokens)."""
    s, b, layers = shape, shape.dtype_bytes, shape.layers
    q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
    kv_read = int(batch * context * 2 * kv_dim * b)
    return [
        _matmul("qkv", layers, batch, s.hidden, q_dim + 2 * kv_dim, b),
        Op(
            "attention",
            layers,
            0,
            kv_read + 2 * batch * q_dim * b,
            int(4 * batch * context * q_dim),  # q.k and p.v over the context
        ),
        _matmul("o_proj", layers, batch, q_dim, s.hidden, b),
        _matmul("gate_up", layers, batch, s.hidden, 2 * s.intermediate, b),
        _matmul("down", layers, batch, s.intermediate, s.hidden, b),
        _matmul("lm_head", 1, batch, s.hidden, s.vocab, b),
    ]


@dataclass(frozen=True)
class Floors:
    weight_bytes: int
    kv_bytes: int
    flops: int
    memory_floor_s: float  # (weights + KV) / bandwidth
    roofline_s: float  # sum over ops of max(bytes / bandwidth, FLOPs / matmul rate)
    per_op_s: dict[str, float]


def decode_floors(
    shape: DecodeShape, batch: int, context: float, bandwidth: float, matmul_rate: float
) -> Floors:
    ops = decode_ops(shape, batch, context)
    weights = sum(op.count * op.weight_bytes for op in ops)
    per_layer = int(batch * context * 2 * shape.kv_heads * shape.head_dim * shape.dtype_bytes)
    kv_bytes = shape.layers * per_layer
    per_op = {op.name: op.seconds(bandwidth, matmul_rate) for op in ops}
    return Floors(
        weight_bytes=weights,
        kv_bytes=kv_bytes,
        flops=sum(op.count * op.flops for op in ops),
        memory_floor_s=(weights + kv_bytes) / bandwidth,
        roofline_s=sum(per_op.values()),
        per_op_s=per_op,
    )


def prefill_flops(shape: DecodeShape, tokens: int) -> int:
    """FLOPs of one fresh prompt of ``tokens`` tokens, as the engine computes it: every
    projection over every token, causal attention (q.k and p.v over the ``T(T+1)/2``
    pairs of the lower triangle, diagonal included), the LM head for the last token only.
    The elementwise ops are left out (as in the decode roofline)."""
    s, layers = shape, shape.layers
    q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_token = s.hidden * (q_dim + 2 * kv_dim) + q_dim * s.hidden + 3 * s.hidden * s.intermediate
    projections = 2 * tokens * per_token * layers
    attention = 4 * q_dim * (tokens * (tokens + 1) // 2) * layers
    return projections + attention + 2 * s.hidden * s.vocab
