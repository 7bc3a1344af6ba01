"""Decode steps replayed from CUDA graphs give the same tokens as eager steps.

Needs a CUDA GPU (skips elsewhere). Five prompts of different lengths decode together,
so replays use padded buckets (5 rows in the bucket of 8) and rows leave the batch as
they finish at different ``max_tokens``. A prompt sent again recomputes its last block
from the short prefill graph (``cuda.prefill_graph``), with the tokens of eager steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import prompts_of_lengths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _engine(
    folder: Path, cuda_graphs: bool, dtype: str = "auto", fast_paths: bool = True
) -> LLMEngine:
    config = EngineConfig(
        model=str(folder), device="cuda", num_kv_blocks=256, max_num_seqs=16,
        cuda_graphs=cuda_graphs, dtype=dtype, cuda_fast_paths=fast_paths,
    )  # fmt: skip
    return LLMEngine(config)


def test_graph_replay_matches_eager_steps(tiny_llama_folder: Path) -> None:
    prompts = prompts_of_lengths([3, 17, 40, 64, 9], seed=5)
    runs = []
    for cuda_graphs in (True, False):
        engine = _engine(tiny_llama_folder, cuda_graphs)
        streams = [
            engine.add_request(p, SamplingParams(max_tokens=10 + 3 * i, temperature=0.0,
                                                 ignore_eos=True))
            for i, p in enumerate(prompts)
        ]  # fmt: skip
        while not all(s.finished for s in streams):
            engine.step()
        runs.append([s.token_ids for s in streams])

    assert runs[0] == runs[1]
    assert [len(t) for t in runs[0]] == [10, 13, 16, 19, 22]


def test_seeded_sampling_on_the_gpu_ignores_the_rest_of_the_batch(
    tiny_llama_folder: Path,
) -> None:
    engine = _engine(tiny_llama_folder, cuda_graphs=True)
    prompt = prompts_of_lengths([12], seed=6)[0]
    seeded = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=7)

    alone = engine.generate([prompt], seeded)[0].token_ids
    others = prompts_of_lengths([5, 30], seed=8)
    crowd = engine.generate([*others, prompt], seeded)[2].token_ids

    assert alone == crowd
    assert len(set(alone)) > 1


def test_chained_decode_bursts_match_single_replays(tiny_llama_folder: Path) -> None:
    # Bursts of 8 chain graph replays on the device; rows stop at a stop token or at
    # different max_tokens inside a burst.
    prompts = prompts_of_lengths([5, 19, 33], seed=11)
    runs = []
    for burst in (1, 8):
        config = EngineConfig(
            model=str(tiny_llama_folder), device="cuda", num_kv_blocks=256, max_num_seqs=16,
            block_size=4, decode_burst=burst,
        )  # fmt: skip
        engine = LLMEngine(config)
        assert engine.decode_burst == burst
        params = [
            SamplingParams(max_tokens=11 + 4 * i, temperature=0.0, ignore_eos=True)
            for i in range(len(prompts))
        ]
        if runs:  # the second run stops the first prompt at its 6th token
            first = runs[0][0]
            params[0] = SamplingParams(
                max_tokens=11, temperature=0.0, ignore_eos=True, stop_token_ids=(first[5],)
            )
        streams = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        while not all(s.finished for s in streams):
            engine.step()
        runs.append([s.token_ids for s in streams])
        pool = engine.parts.kv_manager.pool
        assert pool.num_free_blocks == pool.num_blocks

    first = runs[0][0]
    assert runs[1][0] == first[: first.index(first[5]) + 1]
    assert runs[1][1:] == runs[0][1:]


def test_a_cached_prompt_replays_its_last_block_from_the_short_prefill_graph(
    tiny_llama_folder: Path,
) -> None:
    # Block size 16: 2, 2 and 1 cached blocks; the last 8, 16 and 4 tokens are recomputed.
    prompts = prompts_of_lengths([40, 48, 20], seed=9)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    graphs = _engine(tiny_llama_folder, cuda_graphs=True, dtype="float32")  # the default
    short = graphs.parts.runner.short_prefill
    assert short is not None
    replayed: list[int] = []
    replay = short.replay

    def counted(plan):
        replayed.append(plan.prefills[0].num_new)
        return replay(plan)

    short.replay = counted  # type: ignore[method-assign]
    runs = []
    before = _engine(tiny_llama_folder, cuda_graphs=False, dtype="float32", fast_paths=False)
    for engine in (before, graphs):
        cold = [engine.generate([p], params)[0].token_ids for p in prompts]
        cached = [engine.generate([p], params)[0].token_ids for p in prompts]
        runs.append((cold, cached))

    assert runs[0] == runs[1]  # the eager engine runs the kernels of before (fast paths off)
    assert runs[1][0] == runs[1][1]
    assert replayed == [8, 16, 4]


def test_no_short_prefill_graph_with_the_fast_paths_off(tiny_llama_folder: Path) -> None:
    engine = _engine(tiny_llama_folder, cuda_graphs=True, fast_paths=False)
    assert engine.parts.runner.short_prefill is None
    assert not any(layer.skinny_projections for layer in engine.parts.runner.model.layers)
