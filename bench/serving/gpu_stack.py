"""The whole stack on a GPU: ``dynask run`` on a saved random-weight model, streaming clients.

1. Saves a random bf16 model of Llama-3.1-8B's shape (``bench.engine.cuda``) as a HF
   folder with the given tokenizer files (once; reused when ``--model-dir`` has one).
   Its LM head's rows past the tokenizer's vocabulary are zero (``in_vocabulary_only``),
   so every token it picks has text: Llama-3.1's 128,256 ids against SmolLM2's 49,152
   otherwise make ~60% of the tokens ids the tokenizer cannot spell, deltas without
   text, which the control plane holds until a later delta carries text
   (``reliability.stream_progress``: the point a migrated request resumes at), so the
   client saw tokens in bursts (ITL p50 0.01 ms on the H200, 2026-12-01) that measured
   this artefact, not the streaming. The shape, and so each step's cost, is unchanged.
2. For each ``--caps`` value starts ``dynask run FOLDER --device cuda`` (LocalCluster, one
   engine worker, the control plane; ``--max-prefill-tokens-with-decodes CAP`` unless
   ``none``), waits for ``/health``, then at each ``--clients`` level runs a closed loop
   of streaming ``/v1/completions`` clients (``bench.common.load``: ~``--prompt-tokens``
   text prompts that share no KV block, ``--max-tokens`` tokens, EOS ignored), a warm-up
   window first. Per level: TTFT and ITL p50/p99, output tok/s, tokens per chunk, and the
   control plane's CPU milliseconds per request (utime + stime of the ``dynask run``
   process, whose engine runs in a worker process of its own).

Run on the GPU machine from the repository root (``bench/h200.sh stack`` does)::

    python -m bench.serving.gpu_stack --tokenizer .devcarry/tokenizer --clients 1,16,64

Prints a table and writes JSON to ``bench/results/serve-h200-stack.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common.load import LoadSpec, build_prompts, new_client, run_load, summarize
from bench.common.processes import cpu_seconds, free_port, spawned, wait_until_ready
from bench.common.report import machine_facts, write_json

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "serve-h200-stack.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


MARKER = "dynask-bench-model.json"  # written with the folder: how it was made


def save_random_model(folder: Path, tokenizer: Path, name: str, device: str = "cuda") -> None:
    """A random HF checkpoint of the named shape with ``tokenizer``'s files beside it,
    speaking only ids the tokenizer knows (module docstring)."""
    if (folder / MARKER).exists():
        return
    import torch

    from bench.engine.cuda import build_random_llama

    started = time.perf_counter()
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = build_random_llama(name, dtype, torch.device(device))
    vocabulary = in_vocabulary_only(model, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    for file in TOKENIZER_FILES:
        if (tokenizer / file).exists():
            shutil.copy(tokenizer / file, folder / file)
    (folder / MARKER).write_text(f'{{"shape": "{name}", "ids_in_vocabulary": {vocabulary}}}\n')
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(f"saved {name} to {folder} in {time.perf_counter() - started:.0f} s", flush=True)


def in_vocabulary_only(model: Any, tokenizer: Path) -> int:
    """Zeroes the LM head's rows from the tokenizer's vocabulary size on (untied
    embeddings: the input side keeps its rows), so argmax over random logits picks a
    known id: every other logit is a random ± value and the largest of ~49k of them is
    far above 0. Returns that vocabulary size."""
    import torch
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(tokenizer))
    head = model.get_output_embeddings().weight
    if head is model.get_input_embeddings().weight:
        raise ValueError("tied embeddings: zeroing the head would zero the inputs too")
    with torch.no_grad():
        head[size:] = 0
    return size


def run_argv(
    folder: Path, port: int, cap: int | None, args: argparse.Namespace, fast_paths: bool = True
) -> list[str]:
    argv = [
        sys.executable, "-m", "dynask.control_plane.cli", "run", str(folder),
        "--device", "cuda", "--port", str(port), "--max-num-seqs", str(max(args.clients)),
        "--max-model-len", str(args.max_model_len),
        "--max-num-batched-tokens", str(args.max_batched_tokens),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
        "--database-url", f"sqlite:///{args.workdir / 'dynask.db'}",
    ]  # fmt: skip
    if cap is not None:
        argv += ["--max-prefill-tokens-with-decodes", str(cap)]
    argv.append("--cuda-fast-paths" if fast_paths else "--no-cuda-fast-paths")
    return argv + shlex.split(args.run_args)


async def measure_level(
    base_url: str, model: str, prompts: list[str], clients: int, args: argparse.Namespace, pid: int
) -> dict[str, Any]:
    spec = LoadSpec(concurrency=clients, max_tokens=args.max_tokens, timeout_s=300.0)
    warm = prompts[:clients]
    measured = prompts[clients : clients + max(args.min_requests, args.rounds * clients)]
    async with new_client(spec, base_url) as client:
        await run_load(client, spec, model, warm)
        cpu_before = cpu_seconds(pid)
        wall, records = await run_load(client, spec, model, measured)
        cpu_after = cpu_seconds(pid)
    summary = summarize(wall, records, args.max_tokens)
    cp_ms = (cpu_after - cpu_before) * 1e3 / max(1, summary.requests_ok)
    return {"clients": clients, "control_plane_cpu_ms_per_request": cp_ms, **asdict(summary)}


def measure_cap(
    folder: Path, cap: int | None, args: argparse.Namespace, fast_paths: bool = True
) -> list[dict[str, Any]]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    total = sum(c + max(args.min_requests, args.rounds * c) for c in args.clients)
    prompts = build_prompts(tokenizer, total, args.prompt_tokens, f"stack-{cap}")
    rows = []
    name = f"dynask-run-{cap}" + ("" if fast_paths else "-no-fast-paths")
    with spawned(name, run_argv(folder, port, cap, args, fast_paths), args.workdir) as server:
        started = time.perf_counter()
        wait_until_ready(f"{base_url}/health", '"ready"', args.ready_timeout, [server])
        print(f"{name}: ready in {time.perf_counter() - started:.0f} s", flush=True)
        model = httpx.get(f"{base_url}/v1/models").json()["data"][0]["id"]
        offset = 0
        for clients in args.clients:
            count = clients + max(args.min_requests, args.rounds * clients)
            level_prompts = prompts[offset : offset + count]
            offset += count
            row = asyncio.run(
                measure_level(base_url, model, level_prompts, clients, args, server.pid)
            )
            rows.append({"cap": cap, "cuda_fast_paths": fast_paths, **row})
            print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict[str, Any]) -> str:
    def num(key: str, spec: str = ".1f") -> str:
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    cap = f"{row['cap'] or 'none'}{'' if row.get('cuda_fast_paths', True) else '+off'}"
    return (
        f"{cap:>8}  {row['clients']:>7}  {row['requests_ok']:>4}/"
        f"{row['requests_ok'] + row['requests_failed']:<4}  {num('output_tok_per_s', '.0f'):>8}  "
        f"{num('ttft_p50_ms'):>8}  {num('ttft_p99_ms'):>8}  {num('itl_p50_ms', '.2f'):>7}  "
        f"{num('itl_p99_ms', '.2f'):>7}  {num('tokens_per_chunk', '.2f'):>7}  "
        f"{num('control_plane_cpu_ms_per_request', '.2f'):>8}"
    )


HEADER = (
    f"{'cap':>8}  {'clients':>7}  {'ok/sent':>9}  {'tok/s':>8}  {'TTFT p50':>8}  "
    f"{'TTFT p99':>8}  {'ITL p50':>7}  {'ITL p99':>7}  {'tok/chk':>7}  {'CP ms/req':>8}"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="dynask run on a GPU under streaming load")
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer files folder")
    parser.add_argument("--random-model", default="llama-8b")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/dynask-random-llama-8b"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dynask-gpu-stack"))
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--caps", default="none", help="max_prefill_tokens_with_decodes values")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="measured requests per client")
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--ready-timeout", type=float, default=400.0)
    parser.add_argument(
        "--cuda-fast-paths", default="on", dest="fast_paths",
        help="on, off, or off,on: each a dynask run of its own (--[no-]cuda-fast-paths)",
    )  # fmt: skip
    parser.add_argument("--run-args", default="", help="more dynask run flags, for every run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.fast_paths = [{"off": False, "on": True}[v] for v in args.fast_paths.split(",")]
    args.clients = [int(c) for c in args.clients.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    save_random_model(args.model_dir, args.tokenizer, args.random_model)
    caps = [None if c == "none" else int(c) for c in args.caps.split(",")]
    print(HEADER, flush=True)
    rows = [
        row
        for fast_paths in args.fast_paths
        for cap in caps
        for row in measure_cap(args.model_dir, cap, args, fast_paths)
    ]
    print("\n" + HEADER + "\n" + "\n".join(format_row(r) for r in rows))
    import torch

    write_json(
        args.out,
        {
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {
                **machine_facts(load_start),
                "torch_version": torch.__version__,
                "gpu_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            },
            "model": args.random_model,
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": rows,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
