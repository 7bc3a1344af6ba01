"""The block copy's plan on a CPU: runs of consecutive blocks, the row table's exact
offsets, word and alignment, and the table carried out by hand over one flat buffer (what
the Triton kernel does on a GPU: tests/kv/test_block_copy_cuda.py, on the H200)."""

from __future__ import annotations

import pytest
import torch

from dynask.kv.gpu.block_copy import BlockLayout, block_runs, copy_blocks, row_table


def views(buffer: torch.Tensor, starts: list[int], blocks: int, shape: tuple[int, ...]):
    """Cache tensors of ``blocks`` blocks of ``shape``, at element ``starts`` of one flat
    ``buffer`` (so every address is known relative to it)."""
    size = blocks * int(torch.Size(shape).numel())
    return [buffer[s : s + size].view(blocks, *shape) for s in starts]


def run_by_hand(buffer: torch.Tensor, table) -> None:
    """Carries out ``table`` as the kernel does, with addresses inside ``buffer``."""
    words = buffer.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[table.word_bytes])
    origin = buffer.data_ptr()
    src0 = (table.src_base - origin) // table.word_bytes
    dst0 = (table.dst_base - origin) // table.word_bytes
    for s, d in zip(table.src_offsets.tolist(), table.dst_offsets.tolist(), strict=True):
        words[dst0 + d : dst0 + d + table.row_words] = words[src0 + s : src0 + s + table.row_words]


def test_runs_of_consecutive_blocks_are_found_on_both_sides() -> None:
    assert block_runs([3, 4, 9, 1], [10, 11, 12, 13]) == [(3, 10, 2), (9, 12, 1), (1, 13, 1)]
    assert block_runs([0, 1, 2], [5, 6, 7]) == [(0, 5, 3)]
    with pytest.raises(ValueError, match="3 source blocks for 2 destination blocks"):
        block_runs([0, 1, 2], [5, 6])


def test_rows_are_offsets_in_words_from_each_sides_first_tensor() -> None:
    buffer = torch.zeros(200, dtype=torch.float32)  # blocks of 8 floats = 32 bytes
    sources = views(buffer, [0, 24], 3, (2, 4))  # the second tensor 96 bytes further
    destinations = views(buffer, [64, 128], 4, (2, 4))
    table = row_table(sources, [2, 0], destinations, [3, 1])
    assert table is not None
    assert (table.word_bytes, table.row_words, table.rows, table.nbytes) == (4, 8, 4, 128)
    assert table.align_words == 4  # every address and the row are multiples of 16 bytes
    assert (table.src_base, table.dst_base) == (sources[0].data_ptr(), destinations[0].data_ptr())
    # tensor-major: (tensor 0, block 2), (tensor 0, block 0), (tensor 1, block 2), ...
    assert table.src_offsets.tolist() == [16, 0, 24 + 16, 24 + 0]
    assert table.dst_offsets.tolist() == [24, 8, 64 + 24, 64 + 8]


def test_odd_rows_and_addresses_take_narrower_words() -> None:
    buffer = torch.zeros(400, dtype=torch.float16)
    sources = views(buffer, [1, 40], 2, (3, 5))  # 30-byte blocks at odd element starts
    destinations = views(buffer, [101, 200], 3, (3, 5))
    table = row_table(sources, [1], destinations, [2])
    assert table is not None
    assert (table.word_bytes, table.row_words, table.align_words) == (2, 15, 1)
    assert table.src_offsets.tolist() == [15, 39 + 15]
    assert table.dst_offsets.tolist() == [30, 99 + 30]


@pytest.mark.parametrize(
    ("dtype", "shape", "starts"),
    [(torch.bfloat16, (4, 2, 8), [0, 4096, 512, 8192]), (torch.float16, (3, 1, 5), [3, 990])],
)
def test_the_table_copies_exactly_the_blocks_a_per_tensor_copy_does(
    dtype: torch.dtype, shape: tuple[int, ...], starts: list[int]
) -> None:
    generator = torch.Generator().manual_seed(5)
    buffer = torch.randn(40_000, generator=generator).to(dtype)
    original, expected = buffer.clone(), buffer.clone()
    layers = len(starts) // 2
    src_ids, dst_ids = [7, 0, 1, 2, 9], [3, 4, 5, 11, 0]
    for flat in (buffer, expected):
        sources = views(flat, starts[:layers], 10, shape)
        destinations = views(flat, [s + 20_000 for s in starts[layers:]], 12, shape)
        if flat is expected:
            copy_blocks(sources, src_ids, destinations, dst_ids)  # CPU: tensor by tensor
        else:
            table = row_table(sources, src_ids, destinations, dst_ids)
            assert table is not None and table.rows == layers * len(src_ids)
            run_by_hand(buffer, table)
    assert torch.equal(buffer, expected)
    assert not torch.equal(buffer, original)  # blocks did move


def test_ids_outside_a_cache_and_mismatched_caches_are_refused() -> None:
    sources = [torch.zeros(4, 2, 3) for _ in range(2)]
    destinations = [torch.zeros(6, 2, 3) for _ in range(2)]
    with pytest.raises(ValueError, match=r"block ids 1\.\.6 for caches of 6 blocks"):
        row_table(sources, [0, 1], destinations, [1, 6])
    with pytest.raises(ValueError, match=r"block ids 0\.\.4 for caches of 4 blocks"):
        row_table(sources, [4, 0], destinations, [1, 2])
    with pytest.raises(ValueError, match="2 source blocks for 1 destination blocks"):
        row_table(sources, [0, 1], destinations, [1])
    with pytest.raises(ValueError, match=r"torch.float32\[2, 3\] here, torch.float32\[3, 2\]"):
        row_table(sources, [0], [torch.zeros(6, 3, 2)] * 2, [1])
    with pytest.raises(ValueError, match="2 cache tensors here, 1 there"):
        row_table(sources, [0], destinations[:1], [1])


def test_caches_that_do_not_fit_one_table_have_none() -> None:
    strided = torch.zeros(3, 4, 6).transpose(1, 2)  # blocks not contiguous
    assert row_table([strided], [0], [torch.zeros(3, 6, 4)], [1]) is None
    mixed = [torch.zeros(4, 2, 3), torch.zeros(4, 2, 5)]  # blocks of two sizes
    assert row_table(mixed, [0], [torch.zeros(4, 2, 3), torch.zeros(4, 2, 5)], [1]) is None


def test_a_layout_found_once_plans_every_transfer_between_the_same_caches() -> None:
    buffer = torch.zeros(200, dtype=torch.float32)
    sources = views(buffer, [0, 24], 3, (2, 4))
    destinations = views(buffer, [64, 128], 4, (2, 4))
    layout = BlockLayout.of(sources, destinations)
    assert layout is not None
    for src_ids, dst_ids in (([2, 0], [3, 1]), ([1], [0]), ([], [])):
        reused, fresh = (
            layout.rows(src_ids, dst_ids),
            row_table(sources, src_ids, destinations, dst_ids),
        )
        assert fresh is not None
        assert reused.src_offsets.tolist() == fresh.src_offsets.tolist()
        assert reused.dst_offsets.tolist() == fresh.dst_offsets.tolist()
    assert layout.fits(list(sources), list(destinations))
    assert not layout.fits([s.clone() for s in sources], destinations)  # other tensors
    assert not layout.fits(sources[:1], destinations[:1])
    assert copy_blocks(sources, [0], destinations, [0], layout) is None  # CPU: per tensor


def test_rows_built_by_torch_on_a_device_equal_the_numpy_ones() -> None:
    # launch_blocks builds the rows on the copy's device (the same arithmetic in torch);
    # on a CPU "device" the numbers must be the same, tensor-major.
    buffer = torch.zeros(400, dtype=torch.float16)
    sources = views(buffer, [0, 40, 80], 4, (2, 5))
    destinations = views(buffer, [160, 250, 340], 6, (2, 5))
    layout = BlockLayout.of(sources, destinations)
    assert layout is not None and layout.fused_on is None  # no CUDA: tensor by tensor
    on_device = layout.rows([3, 0], [5, 1], torch.device("cpu"))
    assert on_device.src_offsets.tolist() == [15, 0, 35, 20, 55, 40]  # words of 4 bytes
    assert on_device.dst_offsets.tolist() == [25, 5, 70, 50, 115, 95]
    assert on_device.src_offsets.tolist() == layout.rows([3, 0], [5, 1]).src_offsets.tolist()
    assert layout.rows([], [], torch.device("cpu")).rows == 0
