"""``EngineConfig.cuda_fast_paths`` (on by default): off, the model, the step's inputs and
the attention call exactly the ops and kernels of before; on, the skinny projections, the
split prefill kernel and the cuDNN/no-copy lone chunk. A CPU engine runs the ops of before
whatever the flag. All on a CPU: the calls are recorded (the launches themselves are
faked), not timed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine import attention, model_runner
from dynask.actors.engine import model as model_module
from dynask.actors.engine.attention import AttentionMetadata, PagedPrefill, paged_attention
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.cuda import fused_ops, skinny_matmul, step, triton_attention
from dynask.actors.engine.cuda.step import CudaLayout, build_cuda_inputs
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.step_plan import PrefillSpan, StepPlan, StepRows

# What one decoder layer of before runs, in order (the CPU: no fused RoPE).
LAYER_OF_BEFORE = [
    "add_rms_norm", "qkv_proj", "paged_attention", "o_proj",
    "add_rms_norm", "gate_up_proj", "silu_and_mul", "down_proj",
]  # fmt: skip
# Skinny projections on: the same torch ops (the CPU), reached through skinny_matmul.
SKINNY_LAYER = [
    "norm_linear", "add_rms_norm", "qkv_proj", "paged_attention", "linear", "o_proj",
    "norm_linear", "add_rms_norm", "gate_up_proj", "gated_linear", "silu_and_mul", "down_proj",
]  # fmt: skip


def _recorded(calls: list[str], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return function(*args, **kwargs)

    return record


def _trace_one_prefill(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, metas: list[AttentionMetadata] | None = None
) -> list[str]:
    """The ops of one prefill step, in order; ``metas`` collects the attention metadata."""
    calls: list[str] = []
    for module, names in (
        (fused_ops, ["add_rms_norm", "silu_and_mul"]),
        (skinny_matmul, ["norm_linear", "linear", "gated_linear"]),
    ):
        for name in names:
            monkeypatch.setattr(module, name, _recorded(calls, name, getattr(module, name)))

    def attend(*args: Any, **kwargs: Any) -> torch.Tensor:
        if metas is not None:
            metas.append(args[5])
        return paged_attention(*args, **kwargs)

    recorded = _recorded(calls, "paged_attention", attend)
    monkeypatch.setattr(model_module, "paged_attention", recorded)
    model = engine.parts.runner.model
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            module.register_forward_hook(lambda *_, leaf=leaf: calls.append(leaf))
    engine.generate([[5, 9, 2, 7, 3]], SamplingParams(max_tokens=1, temperature=0.0))
    return calls


@pytest.mark.parametrize("fast_paths", [None, True, False])
def test_a_cpu_engine_runs_the_ops_of_before_whatever_the_flag(
    tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch, fast_paths: bool | None
) -> None:
    # None: the config's default (on), which a CPU device must not take.
    flag = {} if fast_paths is None else {"cuda_fast_paths": fast_paths}
    config = EngineConfig(model=str(tiny_llama_folder), device="cpu", num_kv_blocks=16, **flag)
    assert config.cuda_fast_paths is (fast_paths is not False)
    engine = LLMEngine(config)
    runner = engine.parts.runner
    assert runner.cuda_layout is None and runner.short_prefill is None
    layers = runner.model.layers
    assert not any(layer.skinny_projections for layer in layers)
    metas: list[AttentionMetadata] = []

    calls = _trace_one_prefill(engine, monkeypatch, metas)

    assert calls == LAYER_OF_BEFORE * len(layers) + ["add_rms_norm", "lm_head"]
    assert len(metas) == len(layers)
    assert not any(meta.cuda_fast_paths for meta in metas)
    assert all(meta.paged_prefill is None and meta.paged_decode is None for meta in metas)


def test_a_model_with_skinny_projections_goes_through_skinny_matmul_with_the_same_tokens(
    tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(model=str(tiny_llama_folder), device="cpu", num_kv_blocks=16)
    engines = [LLMEngine(config), LLMEngine(config)]
    engines[1].parts.runner.model.use_skinny_projections()  # what the CUDA runner does
    prompts = [[5, 9, 2, 7, 3], list(range(3, 40))]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    tokens = [[s.token_ids for s in e.generate(prompts, params)] for e in engines]

    calls = _trace_one_prefill(engines[1], monkeypatch)

    assert tokens[0] == tokens[1]
    layers = len(engines[1].parts.runner.model.layers)
    assert calls == SKINNY_LAYER * layers + ["add_rms_norm", "lm_head"]


def _cached_prompt_plan() -> StepPlan:
    # The last 8 tokens of a 600-token prompt after 592 cached ones (block size 16).
    rows = StepRows(list(range(8)), list(range(592, 600)), list(range(600, 608)))
    return StepPlan(rows=rows, ends=[7], prefills=[PrefillSpan(0, 8, 592, list(range(38)))])


@pytest.mark.parametrize(("fast_paths", "splits"), [(False, 1), (True, 4)])
def test_step_inputs_split_the_prefill_keys_only_with_the_fast_paths(
    monkeypatch: pytest.MonkeyPatch, fast_paths: bool, splits: int
) -> None:
    # A CPU-only torch cannot pin memory: the step's copies go unpinned here.
    monkeypatch.setattr(
        step, "to_device", lambda rows, dtype, device: torch.tensor(rows, dtype=dtype)
    )
    layout = CudaLayout(
        16, num_kv_heads=8, group=4, num_sms=132, scratch_slot=0, fast_paths=fast_paths
    )

    meta = build_cuda_inputs(_cached_prompt_plan(), layout, torch.device("cpu")).meta

    assert meta.cuda_fast_paths is fast_paths
    assert meta.paged_prefill is not None
    assert meta.paged_prefill.num_splits == splits
    assert meta.paged_prefill.tiles.tolist() == [[0], [0], [8], [592]]


def _fake_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    launched: list[tuple[str, int]] = []

    def old(*args: Any) -> None:
        launched.append(("paged_prefill", len(args)))

    def split(*args: Any) -> None:
        launched.append(("paged_prefill_split", args[8]))

    monkeypatch.setattr(triton_attention, "paged_prefill", old)
    monkeypatch.setattr(triton_attention, "paged_prefill_split", split)
    monkeypatch.setattr(triton_attention, "prefill_partials", lambda *args: (None, None))
    return launched


@pytest.mark.parametrize(
    ("splits", "launch"), [(1, ("paged_prefill", 8)), (4, ("paged_prefill_split", 4))]
)
def test_one_split_launches_the_prefill_kernel_of_before(
    monkeypatch: pytest.MonkeyPatch, splits: int, launch: tuple[str, int]
) -> None:
    launched = _fake_launches(monkeypatch)
    q = torch.zeros((8, 4, 16))
    cache = torch.zeros((4, 16, 1, 16))
    tiles = torch.tensor([[0], [0], [8], [48]], dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(8),
        paged_prefill=PagedPrefill(torch.zeros((1, 4), dtype=torch.int32), tiles, splits),
    )

    paged_attention(q, q[:, :1], q[:, :1], cache, cache, meta, 0.25)

    assert launched == [launch]


@pytest.mark.parametrize("fast_paths", [False, True])
def test_cudnn_is_asked_for_only_with_the_fast_paths(
    monkeypatch: pytest.MonkeyPatch, fast_paths: bool
) -> None:
    asked: list[list[Any]] = []
    monkeypatch.setattr(attention, "_cudnn_ok", lambda: True)
    monkeypatch.setattr(attention, "sdpa_kernel", lambda backends: asked.append(backends))

    attention._fresh_chunk_backends(torch.device("cuda"), 4096, torch.bfloat16, fast_paths)

    first = (
        attention.SDPBackend.CUDNN_ATTENTION if fast_paths else attention.SDPBackend.FLASH_ATTENTION
    )
    assert asked[0][0] == first
    assert asked[0][-3:] == attention._GPU_SDPA_BACKENDS


@pytest.mark.parametrize(
    ("fast_paths", "started"),
    [
        (False, ["compile_paged_prefill", "DecodeGraphs"]),
        (
            True,
            [
                "compile_paged_prefill",
                "compile_split_prefill",
                "gated_gemm.decide 2048",
                "DecodeGraphs",
                "ShortPrefill",
            ],
        ),
    ],
)
def test_start_up_compiles_and_captures_the_new_code_only_with_the_fast_paths(
    tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch, fast_paths: bool, started: list[str]
) -> None:
    config = EngineConfig(model=str(tiny_llama_folder), device="cpu", num_kv_blocks=16)
    runner: Any = LLMEngine(config).parts.runner
    runner.cuda_layout = CudaLayout(16, 2, 2, 132, 256, fast_paths=fast_paths)
    calls: list[str] = []
    for name in ("compile_paged_prefill", "compile_split_prefill", "DecodeGraphs"):
        monkeypatch.setattr(model_runner, name, _recorded(calls, name, lambda *args: None))
    graph = _recorded(calls, "ShortPrefill", lambda *args: object())
    monkeypatch.setattr(model_runner, "ShortPrefillGraph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(
        model_runner.gated_gemm,
        "decide",
        lambda layer, rows: calls.append(f"gated_gemm.decide {rows}"),
    )

    runner.compile_kernels(2048)
    runner.capture_decode_graphs(4, 64)

    assert calls == started
    assert (runner.short_prefill is not None) is fast_paths
