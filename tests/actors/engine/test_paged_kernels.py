"""The Triton paged-attention kernels against a plain reference (gathered K/V, float64).

They run on a CUDA GPU; on a CPU only under Triton's interpreter (``TRITON_INTERPRET=1``
with triton installed), otherwise they skip. (Triton 3.6's interpreter with numpy 2 fails
on a loop bound loaded from memory — ``int()`` of a 1-element array — unless its tensor
``__index__`` reads ``data.reshape(-1)[0]``; the kernels themselves are fine.)

Shapes cover GQA groups of 1, 3 and 4, block sizes that do not divide the kernel's key
tile, decode rows that are padding, context splits (flash-decoding), and prefill chunks
after a cached prefix, their keys in one program or split over several.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from dynask.actors.engine.cuda import triton_attention


def _kernel_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton"):
        return torch.device("cpu")
    pytest.skip("needs a CUDA GPU, or TRITON_INTERPRET=1 with triton installed")


def _cache(blocks: int, block_size: int, kv_heads: int, dim: int, dtype, device, seed: int):
    generator = torch.Generator().manual_seed(seed)
    shape = (blocks, block_size, kv_heads, dim)
    k = torch.randn(shape, generator=generator).to(device, dtype)
    v = torch.randn(shape, generator=generator).to(device, dtype)
    return k, v


def _reference(q, k_cache, v_cache, table, positions, scale, window=None):
    """Attention of queries at ``positions`` over keys 0..position (the last ``window`` of
    them with a sliding window), in float64."""
    block_size = k_cache.shape[1]
    context = max(positions) + 1
    slots = [table[p // block_size] * block_size + p % block_size for p in range(context)]
    keys = k_cache.flatten(0, 1)[slots].double()  # [context, kv_heads, dim]
    values = v_cache.flatten(0, 1)[slots].double()
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    out = []
    for row, pos in enumerate(positions):
        lo = 0 if window is None else max(0, pos - window + 1)
        scores = torch.einsum("hd,khd->hk", q[row].double(), keys[lo : pos + 1]) * scale
        out.append(torch.einsum("hk,khd->hd", scores.softmax(-1), values[lo : pos + 1]))
    return torch.stack(out)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "block_size", "splits", "dtype", "window"),
    [
        (4, 2, 16, 1, torch.float32, None),
        (3, 1, 5, 4, torch.float32, None),
        (8, 2, 16, 2, torch.bfloat16, None),
        (4, 4, 32, 8, torch.float32, None),
        # Sliding windows: shorter than some rows (70, 133), longer than others (1), not a
        # multiple of the key tile or the block; with and without context splits.
        (4, 2, 16, 1, torch.float32, 50),
        (3, 1, 5, 4, torch.float32, 37),
        (8, 2, 16, 2, torch.bfloat16, 100),
    ],
)
def test_decode_matches_reference(heads, kv_heads, block_size, splits, dtype, window) -> None:
    device = _kernel_device()
    if device.type == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter computes bfloat16 wrongly (numpy has no bfloat16)")
    dim = 32
    seq_lens = [1, 70, 0, 133]  # the third row is padding
    width = -(-max(seq_lens) // block_size)
    blocks = 4 * width + 3
    k_cache, v_cache = _cache(blocks, block_size, kv_heads, dim, dtype, device, seed=1)
    generator = torch.Generator().manual_seed(2)
    tables = torch.randperm(blocks, generator=generator)[: 4 * width].view(4, width)
    q = torch.randn((4, heads, dim), generator=generator).to(device, dtype)
    out = torch.full_like(q, 7.0)

    triton_attention.paged_decode(
        q,
        k_cache,
        v_cache,
        out,
        tables.to(device, torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        dim**-0.5,
        splits,
        window,
    )

    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for row, length in enumerate(seq_lens):
        if length == 0:
            assert torch.all(out[row] == 7.0)  # padding rows are left alone
            continue
        expected = _reference(
            q[row : row + 1],
            k_cache,
            v_cache,
            tables[row].tolist(),
            [length - 1],
            dim**-0.5,
            window,
        )
        torch.testing.assert_close(
            out[row].double().cpu(), expected[0].cpu(), atol=tolerance, rtol=tolerance
        )


@pytest.mark.parametrize(
    ("heads", "kv_heads", "block_size", "window", "splits"),
    [
        (4, 2, 16, None, 1),
        (6, 2, 7, None, 1),
        (4, 2, 16, 30, 1),
        (6, 2, 7, 8, 1),
        (4, 2, 16, 200, 1),
        # Key splits merged by the second kernel: more splits than some tiles have key
        # tiles (empty splits), windows that leave early splits empty.
        (4, 2, 16, None, 2),
        (6, 2, 7, None, 4),
        (4, 2, 16, 30, 4),
        (6, 2, 7, 8, 16),
    ],
)
def test_prefill_after_cached_prefix_matches_reference(
    heads, kv_heads, block_size, window, splits
) -> None:
    device = _kernel_device()
    dim, width = 64, -(-105 // block_size)
    blocks = 2 * width + 1
    k_cache, v_cache = _cache(blocks, block_size, kv_heads, dim, torch.float32, device, seed=3)
    # Two chunks in one step: 40 new tokens after 21 cached, 5 new after 100 cached.
    chunks = [(0, 40, 21), (40, 5, 100)]
    generator = torch.Generator().manual_seed(4)
    tables = torch.randperm(blocks, generator=generator)[: 2 * width].view(2, width)
    q = torch.randn((45, heads, dim), generator=generator).to(device)
    out = torch.full_like(q, float("nan"))  # every row must be written
    group = heads // kv_heads
    tiles = triton_attention.prefill_tiles(chunks, group, device)

    _paged_prefill(
        q, k_cache, v_cache, out, tables.to(device, torch.int32), tiles, dim**-0.5, window, splits
    )

    for index, (start, count, cached) in enumerate(chunks):
        positions = list(range(cached, cached + count))
        expected = _reference(
            q[start : start + count],
            k_cache,
            v_cache,
            tables[index].tolist(),
            positions,
            dim**-0.5,
            window,
        )
        torch.testing.assert_close(
            out[start : start + count].double().cpu(), expected.cpu(), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("splits", [1, 16])
def test_short_chunk_after_a_long_prefix_in_bfloat16(splits) -> None:
    # The cached-prompt case (one block recomputed after a long cached prefix), in the
    # serving dtype: the split launch must agree with the reference like the single one.
    device = _kernel_device()
    if device.type == "cpu":
        pytest.skip("Triton's interpreter computes bfloat16 wrongly (numpy has no bfloat16)")
    heads, kv_heads, block_size, dim = 8, 2, 16, 64
    cached, count = 1000, 16
    width = -(-(cached + count) // block_size)
    k_cache, v_cache = _cache(width + 5, block_size, kv_heads, dim, torch.bfloat16, device, 6)
    generator = torch.Generator().manual_seed(7)
    table = torch.randperm(width + 5, generator=generator)[:width]
    q = torch.randn((count, heads, dim), generator=generator).to(device, torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    tiles = triton_attention.prefill_tiles([(0, count, cached)], heads // kv_heads, device)

    _paged_prefill(
        q, k_cache, v_cache, out, table.view(1, -1).to(device, torch.int32), tiles,
        dim**-0.5, None, splits,
    )  # fmt: skip

    positions = list(range(cached, cached + count))
    expected = _reference(q, k_cache, v_cache, table.tolist(), positions, dim**-0.5)
    torch.testing.assert_close(out.double().cpu(), expected.cpu(), atol=2e-2, rtol=2e-2)


def _paged_prefill(q, k_cache, v_cache, out, tables, tiles, scale, window, splits) -> None:
    # One split: the kernel of before; more: the opt-in split kernel and its merge.
    if splits == 1:
        triton_attention.paged_prefill(q, k_cache, v_cache, out, tables, tiles, scale, window)
    else:
        triton_attention.paged_prefill_split(
            q, k_cache, v_cache, out, tables, tiles, scale, window, splits
        )


def test_a_split_launch_needs_two_splits_at_least() -> None:
    q = torch.zeros((1, 4, 32))
    with pytest.raises(ValueError, match="'num_splits' has value 1; expected >= 2"):
        triton_attention.paged_prefill_split(q, q, q, q, q, q, 1.0, None, 1)


def test_start_up_compile_runs_the_prefill_kernel_on_block_zero() -> None:
    device = _kernel_device()
    k_cache, v_cache = _cache(2, 16, 2, 32, torch.float32, device, seed=5)
    before = (k_cache.clone(), v_cache.clone())

    triton_attention.compile_paged_prefill(k_cache, v_cache, num_heads=4)

    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_start_up_compile_of_the_split_kernels_reads_the_cache_only() -> None:
    device = _kernel_device()
    k_cache, v_cache = _cache(2, 16, 2, 32, torch.float32, device, seed=5)
    before = (k_cache.clone(), v_cache.clone())

    triton_attention.compile_split_prefill(k_cache, v_cache, num_heads=4)

    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
