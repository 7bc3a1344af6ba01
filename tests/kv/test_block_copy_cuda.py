"""The fused block copy on a GPU: one Triton launch moves exactly the blocks a per-tensor
copy does (aligned bf16 caches of Llama-3.1-8B's block shape, and fp16 blocks of 30 bytes
at odd addresses), consecutive and scattered, and writes nothing else. Runs on the H200
(``bench/disaggregation/gpu_serving.sh``); a machine without CUDA cannot run it."""

from __future__ import annotations

import random

import pytest
import torch

from dynask.kv.gpu import block_copy
from dynask.kv.gpu.block_copy import (
    BlockLayout,
    copy_blocks,
    copy_blocks_per_tensor,
    launch_blocks,
    row_table,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda_caches(
    blocks: int, shape: tuple[int, ...], dtype: torch.dtype, skew: int, seed: int | None
) -> list[torch.Tensor]:
    """Six cache tensors, each ``skew`` elements into an allocation of its own; random
    (``seed``) or poisoned with -1."""
    size = blocks * int(torch.Size(shape).numel())
    tensors = []
    for index in range(6):
        flat = torch.empty(size + skew, dtype=dtype, device="cuda")
        if seed is None:
            flat.fill_(-1)
        else:
            generator = torch.Generator().manual_seed(seed + index)
            flat.copy_(torch.randn(size + skew, generator=generator).to(dtype))
        tensors.append(flat[skew:].view(blocks, *shape))
    return tensors


@pytest.mark.parametrize(
    ("shape", "dtype", "skew", "word"),
    [((16, 8, 128), torch.bfloat16, 0, 4), ((3, 1, 5), torch.float16, 1, 2)],
)
@pytest.mark.parametrize("layout", ["consecutive", "scattered"])
def test_one_launch_moves_exactly_the_blocks_of_a_per_tensor_copy(
    shape: tuple[int, ...], dtype: torch.dtype, skew: int, word: int, layout: str
) -> None:
    assert block_copy._kernel() is not None, "Triton must be there on a CUDA machine"
    rng = random.Random(layout)
    if layout == "consecutive":
        src_ids, dst_ids = list(range(10, 160)), list(range(300, 450))
    else:
        src_ids, dst_ids = rng.sample(range(200), 150), rng.sample(range(512), 150)
    source = cuda_caches(200, shape, dtype, skew, seed=11)
    fused = cuda_caches(512, shape, dtype, skew, seed=None)
    expected = cuda_caches(512, shape, dtype, skew, seed=None)
    table = row_table(source, src_ids, fused, dst_ids)
    assert table is not None and table.word_bytes == word and table.rows == 6 * 150
    torch.cuda.synchronize()  # the sources' writes are done, as the engine's are
    copy_blocks(source, src_ids, fused, dst_ids)
    copy_blocks_per_tensor(source, src_ids, expected, dst_ids)
    rest = [i for i in range(512) if i not in set(dst_ids)]
    for mine, theirs, want in zip(fused, source, expected, strict=True):
        assert torch.equal(mine[dst_ids], theirs[src_ids])
        assert bool((mine[rest] == -1).all())
        assert torch.equal(mine, want)


def test_a_layout_reused_builds_the_same_rows_on_the_device_and_copies_them() -> None:
    shape, dtype = (16, 8, 128), torch.bfloat16
    source = cuda_caches(64, shape, dtype, 0, seed=21)
    launched = cuda_caches(96, shape, dtype, 0, seed=None)
    layout = BlockLayout.of(source, launched)
    assert layout is not None and layout.fused_on == source[0].device
    for src_ids, dst_ids in (([5, 6, 7], [90, 0, 44]), ([63], [1]), ([], [])):
        on_cpu, on_gpu = (
            layout.rows(src_ids, dst_ids),
            layout.rows(src_ids, dst_ids, source[0].device),
        )
        assert on_gpu.src_offsets.device.type == "cuda"
        assert on_gpu.src_offsets.tolist() == on_cpu.src_offsets.tolist()
        assert on_gpu.dst_offsets.tolist() == on_cpu.dst_offsets.tolist()
    torch.cuda.synchronize()
    started = launch_blocks(source, [5, 6, 7, 63], launched, [90, 0, 44, 1], layout)
    assert started.layout is layout and started.done is not None  # queued, not waited for
    started.wait()
    for mine, theirs in zip(launched, source, strict=True):
        assert torch.equal(mine[[90, 0, 44, 1]], theirs[[5, 6, 7, 63]])
        assert bool((mine[2:44] == -1).all())
