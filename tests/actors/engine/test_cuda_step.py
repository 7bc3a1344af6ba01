"""The pure parts of the CUDA step: graph buckets, decode splits, prefill tiles (no GPU)."""

from __future__ import annotations

import torch

from dynask.actors.engine.cuda.step import block_row, decode_buckets
from dynask.actors.engine.cuda.triton_attention import (
    decode_splits,
    num_prefill_tiles,
    prefill_splits,
    prefill_tiles,
)


def test_buckets_cover_every_batch_size_up_to_max_num_seqs() -> None:
    assert decode_buckets(1) == [1]
    assert decode_buckets(6) == [1, 2, 4, 6]
    assert decode_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert decode_buckets(200)[-4:] == [128, 160, 192, 200]


def test_splits_fill_about_two_waves_of_an_h200() -> None:
    # 132 SMs, 8 KV heads: batch 1 has 8 programs per split.
    assert [decode_splits(rows, 8, 132) for rows in (1, 4, 16, 32, 48, 256)] == [16, 16, 4, 2, 1, 1]


def test_prefill_tiles_split_chunks_by_rows_per_tile() -> None:
    # group 4 -> 16 tokens per 64-row tile; chunk 1: 40 tokens after 21 cached.
    tiles = prefill_tiles([(0, 40, 21), (40, 5, 100)], 4, torch.device("cpu"))
    assert tiles.tolist() == [
        [0, 0, 0, 1],  # chunk
        [0, 16, 32, 40],  # first query row
        [16, 16, 8, 5],  # query tokens
        [21, 37, 53, 100],  # position of the first query
    ]


def test_prefill_tile_count_matches_the_tiles() -> None:
    chunks = [(0, 40, 21), (40, 5, 100), (45, 64, 0)]
    tiles = prefill_tiles(chunks, 4, torch.device("cpu"))
    assert num_prefill_tiles(chunks, 4) == tiles.shape[1] == 8


def test_prefill_splits_only_when_few_tiles_see_many_keys() -> None:
    # 132 SMs, 8 KV heads. The cached 4,096-token prompt: one tile, 4,096 keys.
    assert prefill_splits(1, 8, 132, 4096) == 16
    assert prefill_splits(4, 8, 132, 4096) == 16  # ceil(264 / 32) = 9 -> 16
    assert prefill_splits(16, 8, 132, 4096) == 4  # ceil(264 / 128) = 3 -> 4
    assert prefill_splits(33, 8, 132, 4096) == 1  # two waves already
    # Each split keeps two key tiles (128 keys) at least.
    assert prefill_splits(1, 8, 132, 600) == 4
    assert prefill_splits(1, 8, 132, 200) == 1


def test_block_rows_are_padded_with_block_zero() -> None:
    assert block_row([7, 3], 4) == [7, 3, 0, 0]
