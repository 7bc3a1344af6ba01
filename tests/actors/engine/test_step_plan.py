"""A step's rows on the host: slots by block runs, host tensors through numpy."""

from __future__ import annotations

import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.scheduler import ScheduledChunk
from dynask.actors.engine.sequence import Sequence
from dynask.actors.engine.step_plan import StepPlan, host_tensor, slot_of, slot_run
from dynask.kv.block import Block


def _sequence(prompt_len: int, block_ids: list[int]) -> Sequence:
    seq = Sequence("r", list(range(100, 100 + prompt_len)), SamplingParams(), None, 0, 0)  # type: ignore[arg-type]
    seq.blocks = [Block(b) for b in block_ids]
    return seq


def test_a_run_of_slots_crosses_blocks_as_the_per_token_lookup_does() -> None:
    seq = _sequence(20, [7, 2, 9])  # block size 8: positions 0-7 in 7, 8-15 in 2, 16-23 in 9
    assert slot_run(seq, 5, 19, 8) == [61, 62, 63, 16, 17, 18, 19, 20, 21, 22, 23, 72, 73, 74]
    for start in range(0, 24):
        for stop in range(start, 25):
            assert slot_run(seq, start, stop, 8) == [slot_of(seq, p, 8) for p in range(start, stop)]


def test_a_chunk_after_a_computed_prefix_gets_its_own_rows() -> None:
    seq = _sequence(12, [3, 1, 5])  # block size 4
    seq.num_computed_tokens = 6
    plan = StepPlan.build([ScheduledChunk(seq, 5)], block_size=4)
    assert plan.rows.ids == [106, 107, 108, 109, 110]
    assert plan.rows.positions == [6, 7, 8, 9, 10]
    assert plan.rows.slots == [6, 7, 20, 21, 22]
    assert plan.ends == [4]
    span = plan.prefills[0]
    assert (span.first_row, span.num_new, span.num_cached, span.block_ids) == (0, 5, 6, [3, 1, 5])


def test_host_tensors_are_the_lists_in_the_asked_type() -> None:
    rows = [[1, 2, 3], [4, 5, 6]]
    wide = host_tensor(rows, torch.long)
    assert wide.dtype == torch.long and wide.tolist() == rows
    narrow = host_tensor([7, 8], torch.int32)
    assert narrow.dtype == torch.int32 and narrow.tolist() == [7, 8]
    assert host_tensor([[], []], torch.long).shape == (2, 0)
