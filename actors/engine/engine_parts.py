"""Building an engine's parts from its config: model, tokenizer, KV cache, block pool."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.kv_cache.manager import KVCacheManager
from dynask.actors.engine.kv_cache.sizing import KVCachePlan, plan_kv_cache
from dynask.actors.engine.kv_cache.tiers import build_kv_offload
from dynask.actors.engine.loader import (
    eos_token_ids,
    load_hf_config,
    load_model,
    load_model_from_tensors,
)
from dynask.actors.engine.logits.defaults import sampling_defaults
from dynask.actors.engine.model import CausalLM
from dynask.actors.engine.model_config import ModelConfig
from dynask.actors.engine.model_runner import KVCacheSpec, ModelRunner
from dynask.actors.engine.scheduler import ScheduledChunk
from dynask.actors.models.model_source import resolve_model
from dynask.actors.models.tokenizer_folder import load_tokenizer
from dynask.kv.events import KVEventLog

log = logging.getLogger(__name__)


class StepRunner(Protocol):
    """Runs scheduled chunks: the real model (``ModelRunner``) or a simulation (mocker)."""

    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """The sampled token per chunk; None for a chunk that stops mid-prefill."""

    def run_decode_burst(self, chunks: list[ScheduledChunk], steps: int) -> list[list[int]]:
        """Greedy tokens of ``steps`` decode steps of ``chunks`` (one list per step), each
        step fed the tokens of the one before; the engine reserved the blocks for all."""

    def export_blocks(self, block_ids: list[int]) -> torch.Tensor: ...

    def import_blocks(self, block_ids: list[int], kv: torch.Tensor) -> None: ...


@dataclass
class EngineParts:
    model_config: ModelConfig
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    plan: KVCachePlan
    runner: StepRunner
    kv_manager: KVCacheManager
    event_log: KVEventLog
    model_origin: str
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # logits/defaults.py


def build_engine_parts(config: EngineConfig) -> EngineParts:
    """Resolves the model, loads weights and tokenizer, and sizes the KV cache."""
    started = time.monotonic()
    source = resolve_model(config.model)
    model_config = ModelConfig.from_hf(load_hf_config(source.folder))
    tokenizer = load_tokenizer(source.folder)
    device = config.torch_device()
    dtype = config.torch_dtype(device)
    max_positions = config.max_model_len or model_config.max_position_embeddings
    model = load_model(source, model_config, max_positions, device, dtype)
    eos = eos_token_ids(source.folder, model_config, tokenizer)
    loaded = LoadedModel(model, model_config, tokenizer, eos, source.origin)
    parts = assemble_engine_parts(config, loaded, started)
    defaults = sampling_defaults(source.folder, bundled=not config.model)
    return replace(parts, sampling_defaults=defaults)


@dataclass(frozen=True)
class LoadedModel:
    """A model on its device with what the engine needs beside the weights."""

    model: CausalLM
    model_config: ModelConfig
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    origin: str


def build_engine_parts_from_hf(config: EngineConfig, hf_model: Any, tokenizer: Any) -> EngineParts:
    """Parts around a live transformers model (benchmarks: no checkpoint on disk).

    Weights already on the engine's device and dtype are shared with ``hf_model``.
    """
    started = time.monotonic()
    model_config = ModelConfig.from_hf(hf_model.config)
    device = config.torch_device()
    dtype = config.torch_dtype(device)
    max_positions = config.max_model_len or model_config.max_position_embeddings
    tensors = iter(hf_model.state_dict().items())
    origin = f"in-memory {type(hf_model).__name__}"
    model = load_model_from_tensors(tensors, origin, model_config, max_positions, device, dtype)
    loaded = LoadedModel(model, model_config, tokenizer, model_config.eos_token_ids, origin)
    return assemble_engine_parts(config, loaded, started)


def kv_cache_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's dtype: the model's, except float32 under 16-bit weights on a CPU.

    Torch's CPU attention kernel is much slower in bf16 than in float32 for decode rows
    (3.35 against 0.65 ms per layer at batch 32 for SmolLM2, measured here: 73% of a bf16
    decode step), so on a CPU the cache and the attention stay float32 while the matmuls
    run in bf16. The cache takes twice the memory of a bf16 one.
    """
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


def assemble_engine_parts(config: EngineConfig, loaded: LoadedModel, started: float) -> EngineParts:
    """Sizes the KV cache for a loaded model, then builds the runner and the block pool."""
    model_config = loaded.model_config
    device = config.torch_device()
    dtype = config.torch_dtype(device)
    cache_dtype = kv_cache_dtype(device, dtype)
    plan = plan_kv_cache(config, model_config, device, cache_dtype)
    spec = KVCacheSpec(
        plan.num_blocks,
        plan.block_size,
        model_config.num_layers,
        model_config.num_kv_heads,
        model_config.head_dim,
        cache_dtype,
    )
    runner = ModelRunner(loaded.model, spec, device, loaded.eos_token_ids, config.cuda_fast_paths)
    if device.type == "cuda":
        runner.compile_kernels(config.max_num_batched_tokens)
    if device.type == "cuda" and config.cuda_graphs:
        runner.capture_decode_graphs(config.max_num_seqs, plan.max_model_len)
    kv_manager, event_log = KVCacheManager.build(
        plan.num_blocks,
        plan.block_size,
        config.enable_prefix_caching,
        config.prefix_cache_protected_share,
    )
    offload = build_kv_offload(config, spec, runner.kv_caches, event_log, loaded.origin)
    if offload is not None:
        kv_manager.attach_offload(offload)
    log.info(
        "loaded %s (%s, %d layers) on %s/%s in %.1fs; KV cache %d blocks x %d tokens "
        "= %d tokens (%.2f GiB, %s); max_model_len %d",
        loaded.origin,
        model_config.model_type,
        model_config.num_layers,
        device,
        dtype,
        time.monotonic() - started,
        plan.num_blocks,
        plan.block_size,
        plan.capacity_tokens,
        plan.gib,
        plan.budget_source,
        plan.max_model_len,
    )
    return EngineParts(
        model_config=model_config,
        tokenizer=loaded.tokenizer,
        eos_token_ids=loaded.eos_token_ids,
        plan=plan,
        runner=runner,
        kv_manager=kv_manager,
        event_log=event_log,
        model_origin=loaded.origin,
    )
