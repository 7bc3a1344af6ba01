"""KV export/import by block: what disaggregation and offload build on."""

from __future__ import annotations

from pathlib import Path

import torch

from dynask.actors.api.sampling_params import SamplingParams
from tests.actors.engine.helpers import make_engine, prompts_of_lengths

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_kv_moved_to_another_engine_serves_identical_output(tiny_llama_folder: Path) -> None:
    source = make_engine(tiny_llama_folder, block_size=16)
    target = make_engine(tiny_llama_folder, block_size=16)
    prompt = prompts_of_lengths([48])[0]
    expected = source.generate([prompt], PARAMS)[0].token_ids
    hit = source.cached_prefix(prompt)
    assert hit.num_blocks == 3

    kv = source.export_kv([int(b.block_id) for b in hit.blocks][:2])
    assert kv.shape == (2, 2, 2, 16, 2, 16)  # layers, k/v, blocks, block_size, heads, dim
    assert target.store_prefix(prompt, kv) == 2

    stored = target.cached_prefix(prompt)
    assert stored.num_blocks == 2
    assert torch.equal(target.export_kv([int(b.block_id) for b in stored.blocks]), kv)
    out = target.generate([prompt], PARAMS)[0]
    assert out.usage is not None and out.usage.cached_tokens == 32
    assert out.token_ids == expected


def test_import_rejects_a_tensor_of_the_wrong_shape(tiny_llama_folder: Path) -> None:
    import pytest

    engine = make_engine(tiny_llama_folder, block_size=16)
    with pytest.raises(ValueError, match=r"KV tensor has shape \(2, 2, 1, 8, 2, 16\)"):
        engine.import_kv([0], torch.zeros(2, 2, 1, 8, 2, 16))
