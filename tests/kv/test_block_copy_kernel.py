"""The fused block copy's kernels themselves: on a GPU, or under Triton's interpreter on a
CPU (``TRITON_INTERPRET=1``: ``make test`` runs this file that way where there is no GPU).

``launch_ids`` computes each row's offsets in the kernel from the block ids and the
tensors' starts; the caches here are views of one flat buffer, blocks of odd sizes
included, and the expected result is the per-tensor copy's."""

from __future__ import annotations

import pytest
import torch

from dynask.kv.gpu.block_copy import BlockLayout, copy_blocks_per_tensor
from tests.actors.engine.test_paged_kernels import _kernel_device


def _caches(buffer: torch.Tensor, starts: list[int], blocks: int, shape: tuple[int, ...]):
    size = blocks * int(torch.Size(shape).numel())
    return [buffer[s : s + size].view(blocks, *shape) for s in starts]


@pytest.mark.parametrize(
    ("dtype", "shape", "src_ids", "dst_ids"),
    [
        (torch.float32, (2, 5), [3, 0], [5, 1]),  # 40-byte blocks: 4-byte words
        (torch.float16, (3, 3), [1, 2, 3], [0, 4, 2]),  # 18-byte blocks: 2-byte words
        (torch.float32, (4, 8), [0, 1, 2, 3], [2, 3, 4, 5]),  # consecutive, 16-byte aligned
        (torch.float32, (2, 5), [2], [0]),  # one block
    ],
)
def test_the_id_kernel_copies_exactly_what_a_per_tensor_copy_does(
    dtype: torch.dtype, shape: tuple[int, ...], src_ids: list[int], dst_ids: list[int]
) -> None:
    from dynask.kv.gpu import block_copy_kernel

    device = _kernel_device()
    per_block = int(torch.Size(shape).numel())
    buffer = torch.randn(40 * per_block + 64, generator=torch.Generator().manual_seed(5))
    buffer = buffer.to(device, dtype)
    # Three tensors a side at uneven distances from each side's first one.
    sources = _caches(buffer, [0, 4 * per_block + 3, 9 * per_block + 7], 4, shape)
    destinations = _caches(buffer, [14 * per_block, 21 * per_block + 5, 30 * per_block], 6, shape)
    expected = [d.clone() for d in destinations]
    copy_blocks_per_tensor(sources, src_ids, expected, dst_ids)
    layout = BlockLayout.of(sources, destinations)
    assert layout is not None
    ids = layout.checked_ids(src_ids, dst_ids)
    src_starts, dst_starts = layout.starts_on(device)
    block_copy_kernel.launch_ids(
        sources[0], destinations[0], src_starts, dst_starts, torch.from_numpy(ids).to(device),
        layout.word_bytes, layout.row_words, layout.align_words,
    )  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize()
    for mine, want in zip(destinations, expected, strict=True):
        assert torch.equal(mine, want)


def test_ids_outside_a_cache_are_refused_before_any_launch() -> None:
    buffer = torch.zeros(200)
    layout = BlockLayout.of(_caches(buffer, [0], 3, (2, 4)), _caches(buffer, [64], 4, (2, 4)))
    assert layout is not None
    assert layout.checked_ids([2, 0], [3, 1]).tolist() == [2, 0, 3, 1]
    with pytest.raises(ValueError, match="block ids 0..3 for caches of 3 blocks"):
        layout.checked_ids([0, 3], [0, 1])
    with pytest.raises(ValueError, match="block ids 1..4 for caches of 4 blocks"):
        layout.checked_ids([0, 1], [1, 4])
    with pytest.raises(ValueError, match="2 source blocks for 1 destination blocks"):
        layout.checked_ids([0, 1], [1])
