"""vLLM's side of ``bench.engine.throughput --vllm``: ``out=vllm`` on the same prompts.

The engine is dynask's ``VLLMEngine`` (vLLM's ``AsyncLLM`` plus our detokenizer and stop
rules), built like ``dynask run out=vllm`` builds it: float32 and eager mode on a CPU,
the bundled SmolLM2. For each batch, right after the built-in engine and HF ran a set of
prompts, vLLM runs the same prompts (``VLLMSide.__call__``): the three see the machine
in the same state and the ratios are what to compare. vLLM's engine core is a process of
its own; its wall time end to end (prefill included) is what is counted, as for ours.

Rows also say how many of vLLM's greedy outputs equal the built-in engine's and HF's
token for token (HF's ``min_new_tokens`` masks EOS, ``ignore_eos`` does not: a row may
differ at an EOS without a bug).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.engine.report import BenchConfig, HFRun, OursRun, ThroughputRow
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.backends.vllm.args import VLLMArgs


@dataclass(frozen=True)
class VLLMRow:
    batch: int
    vllm_tok_s: float
    builtin_tok_s: float
    hf_tok_s: float | None
    builtin_over_vllm: float
    rows_equal_builtin: int
    rows_equal_hf: int | None
    rows: int
    vllm_runs_tok_s: list[float]


class VLLMSide:
    """A started vLLM engine that runs each batch's prompts after ours and HF's."""

    def __init__(self, config: BenchConfig) -> None:
        from dynask.actors.backends.vllm.engine import VLLMEngine

        if config.random_model is not None:
            raise ValueError("--vllm runs the bundled model only; drop --random-model")
        self.config = config
        args = VLLMArgs(
            max_model_len=max(config.prompt_len + config.new_tokens, config.ttft_prompt_len) + 1,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_batched_tokens,
            kv_cache_gib=2.0,
        )
        started = time.perf_counter()
        self.engine = VLLMEngine(args)
        self.start_s = time.perf_counter() - started
        self._runs: dict[int, list[tuple[float, int, int | None, int]]] = {}
        self._run([[101 + i for i in range(32)], [202 + i for i in range(32)]], 4)  # warm-up

    def __call__(
        self, batch: int, prompts: list[list[int]], ours: OursRun, hf: HFRun | None
    ) -> None:
        seconds, outputs = self._run(prompts, self.config.new_tokens)
        equal_ours = _equal_rows(outputs, ours.outputs)
        equal_hf = None if hf is None else _equal_rows(outputs, hf.outputs)
        self._runs.setdefault(batch, []).append((seconds, equal_ours, equal_hf, len(prompts)))

    def _run(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        streams = [self.engine.add_request(prompt, params) for prompt in prompts]
        for stream in streams:
            stream.wait(timeout=3600)
        return time.perf_counter() - start, [stream.token_ids for stream in streams]

    def rows(self, builtin_rows: list[ThroughputRow]) -> list[VLLMRow]:
        out = []
        for row in builtin_rows:
            runs = self._runs.get(row.batch, [])
            if not runs:
                continue
            rates = [row.batch * self.config.new_tokens / seconds for seconds, *_ in runs]
            equal_hf = [r[2] for r in runs if r[2] is not None]
            out.append(
                VLLMRow(
                    batch=row.batch,
                    vllm_tok_s=max(rates),
                    builtin_tok_s=row.ours_tok_s,
                    hf_tok_s=row.hf_tok_s,
                    builtin_over_vllm=row.ours_tok_s / max(rates),
                    rows_equal_builtin=sum(r[1] for r in runs),
                    rows_equal_hf=sum(equal_hf) if equal_hf else None,
                    rows=sum(r[3] for r in runs),
                    vllm_runs_tok_s=rates,
                )
            )
        return out

    def report(self, builtin_rows: list[ThroughputRow]) -> dict[str, Any]:
        return {"start_s": self.start_s, "rows": [asdict(r) for r in self.rows(builtin_rows)]}

    def close(self) -> None:
        self.engine.shutdown()


def _equal_rows(ours: list[list[int]], theirs: list[list[int]]) -> int:
    return sum(a == b for a, b in zip(ours, theirs, strict=True))


def format_vllm_table(rows: list[VLLMRow], start_s: float) -> str:
    lines = [
        f"vLLM (out=vllm, vLLM CPU build; engine start {start_s:.1f} s)",
        "batch  built-in tok/s  vLLM tok/s  HF tok/s  built-in/vLLM  =built-in  =HF",
    ]
    for r in rows:
        hf = f"{r.hf_tok_s:8.1f}" if r.hf_tok_s else "       -"
        same_hf = f"{r.rows_equal_hf}/{r.rows}" if r.rows_equal_hf is not None else "-"
        lines.append(
            f"{r.batch:5d}  {r.builtin_tok_s:14.1f}  {r.vllm_tok_s:10.1f}  {hf}  "
            f"{r.builtin_over_vllm:13.2f}  {r.rows_equal_builtin:>4d}/{r.rows:<4d} {same_hf}"
        )
    return "\n".join(lines)
