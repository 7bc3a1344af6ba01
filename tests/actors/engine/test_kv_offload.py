"""Offload tiers in the built-in engine: onboarded KV gives the recomputed output exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import make_engine, prompts_of_lengths

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # tiny Llama: layers, k/v, tokens, kv heads, dim, f32
GB = 10**9


def small_engine(folder: Path, **tiers: object) -> LLMEngine:
    """8 device blocks: a 100-token prompt (7 blocks with its output) evicts another's."""
    return make_engine(folder, block_size=16, num_kv_blocks=8, **tiers)


def disk_tier(folder: Path) -> dict[str, object]:
    """A disk tier only, writing every evicted block (the frequency filter off)."""
    return {"kv_disk_gb": 64 * 5000 / GB, "kv_disk_path": str(folder), "kv_disk_min_uses": 1}


def run(engine: LLMEngine, prompt: list[int]) -> tuple[list[int], int]:
    """Token ids of the whole output and the cached prompt tokens."""
    stream = engine.generate([prompt], PARAMS)[0]
    assert stream.usage is not None
    return stream.token_ids, stream.usage.cached_tokens


def test_onboarding_from_host_equals_recomputation(tiny_llama_folder: Path) -> None:
    a, b = prompts_of_lengths([100, 100], seed=11)
    recomputed = run(make_engine(tiny_llama_folder, block_size=16), a)[0]
    engine = small_engine(tiny_llama_folder, kv_host_gb=32 * BLOCK_BYTES / GB)

    assert run(engine, a) == (recomputed, 0)
    run(engine, b)  # evicts a's blocks but its first to host memory
    again, cached = run(engine, a)

    assert again == recomputed
    assert cached == 96  # 6 full blocks: 1 still on the device, 5 loaded from the host
    stats = engine.stats()
    assert (stats.host_hit_tokens, stats.disk_hit_tokens) == (80, 0)
    assert stats.host_kv_capacity_blocks == 32
    assert stats.to_dict()["host_hit_rate"] == 80 / 300


def test_the_disk_tier_survives_a_restart_and_serves_the_same_tokens(
    tiny_llama_folder: Path, tmp_path: Path
) -> None:
    a, b, c = prompts_of_lengths([100, 100, 100], seed=12)
    recomputed = run(make_engine(tiny_llama_folder, block_size=16), a)[0]
    first = small_engine(tiny_llama_folder, **disk_tier(tmp_path))
    for prompt in (a, b, c):  # a's 6 full blocks go straight to disk (no host tier)...
        run(first, prompt)
    assert first.stats().disk_kv_blocks == 11  # ...a's 6 and 5 of b's: c's 7 fill the device

    restarted = small_engine(tiny_llama_folder, **disk_tier(tmp_path))
    assert restarted.stats().disk_kv_blocks == 11
    assert restarted.kv_cache_dump().stored[0].tier == "disk"  # the router hears of them
    again, cached = run(restarted, a)

    assert (again, cached) == (recomputed, 96)
    assert restarted.stats().disk_hit_tokens == 96


def test_a_corrupt_block_file_is_recomputed_not_served(
    tiny_llama_folder: Path, tmp_path: Path
) -> None:
    a, b, c = prompts_of_lengths([100, 100, 100], seed=13)
    recomputed = run(make_engine(tiny_llama_folder, block_size=16), a)[0]
    first = small_engine(tiny_llama_folder, **disk_tier(tmp_path))
    run(first, a)
    third_block = first.cached_prefix(a).hashes[2]
    run(first, b)
    run(first, c)
    path = next(tmp_path.rglob(f"{third_block:016x}.kvblock"))
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40  # one bit of the payload
    path.write_bytes(bytes(data))

    restarted = small_engine(tiny_llama_folder, **disk_tier(tmp_path))
    again, cached = run(restarted, a)

    assert again == recomputed
    assert cached == 32  # blocks 0 and 1 loaded; 2 failed its checksum: 2..5 recomputed
    stats = restarted.stats()
    assert (stats.disk_hit_tokens, stats.disk_corrupt_blocks) == (32, 1)
    assert not path.exists()


def test_an_unusable_disk_path_is_named(tiny_llama_folder: Path, tmp_path: Path) -> None:
    import pytest

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(ValueError, match=r"EngineConfig 'kv_disk_path' has value '.*/file'"):
        small_engine(tiny_llama_folder, **disk_tier(not_a_folder))


def test_offload_tiers_need_prefix_caching() -> None:
    import pytest

    from dynask.actors.engine.config import EngineConfig

    with pytest.raises(ValueError, match=r"'enable_prefix_caching' has value False"):
        EngineConfig(enable_prefix_caching=False, kv_host_gb=1.0)


def test_a_disk_read_lets_the_running_requests_go_on(
    tiny_llama_folder: Path, tmp_path: Path
) -> None:
    import os

    a, b, c, other = prompts_of_lengths([100, 100, 100, 20], seed=14)
    recomputed = run(make_engine(tiny_llama_folder, block_size=16), a)[0]
    first = small_engine(tiny_llama_folder, **disk_tier(tmp_path))
    run(first, a)
    first_block = first.cached_prefix(a).hashes[0]
    for prompt in (b, c):
        run(first, prompt)  # a's 6 full blocks are now on disk only
    engine = make_engine(tiny_llama_folder, block_size=16, num_kv_blocks=16, **disk_tier(tmp_path))
    engine.start()
    # a's first block file becomes a pipe nobody writes to yet: reading it blocks (a slow
    # disk that never answers) until this test writes the file's bytes into it.
    path = next(tmp_path.rglob(f"{first_block:016x}.kvblock"))
    data = path.read_bytes()
    path.unlink()
    os.mkfifo(path)
    try:
        running = engine.add_request(other, SamplingParams(max_tokens=30, ignore_eos=True))
        next(iter(running))  # it is running
        waiting = engine.add_request(a, PARAMS)

        running.wait(timeout=120)  # finishes while a's read hangs

        assert not waiting.finished and waiting.received == []
    finally:
        with path.open("wb") as pipe:  # the read completes
            pipe.write(data)
    waiting.wait(timeout=120)
    engine.shutdown()
    assert waiting.token_ids == recomputed
    assert waiting.usage is not None and waiting.usage.cached_tokens == 96
    assert engine.stats().disk_hit_tokens == 96


def test_a_prefix_cache_reset_is_refused_with_offload_tiers(tiny_llama_folder: Path) -> None:
    engine = small_engine(tiny_llama_folder, kv_host_gb=32 * BLOCK_BYTES / GB)
    (a,) = prompts_of_lengths([100], seed=13)
    run(engine, a)

    with pytest.raises(ValueError, match="offload tiers"):
        engine.reset_prefix_cache()
    assert run(engine, a)[1] == 96  # nothing was dropped
