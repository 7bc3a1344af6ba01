"""The systems ``trace_replay.py`` compares, started for one phase each: dynask's
``bench.routing.server`` (mocker actors, one or more control planes) and NVIDIA Dynamo's
frontend + mocker (``../shared/peers/dynamo``), with the mocker timing matched on both
sides (``matched_timing``; the module docstring of ``trace_replay`` says how)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.common.paths import shared_path
from bench.common.processes import free_port, spawned, wait_until_ready

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
DYNAMO_SCRIPTS = shared_path("peers", "dynamo")
DYNAMO_HOME = Path(os.environ.get("PEER_DYNAMO_DIR", Path.home() / ".peer_dynamo"))
DYNAMO_MODEL = "smollm2"
READY_TIMEOUT_S = 600.0
# dynask systems: which of the server's control planes a phase sends to (see the docstring)
DYNASK_PLANES = {
    "dynask": ("synced", 1),
    "dynask-2cp": ("synced", 2),
    "dynask-2cp-unsynced": ("unsynced", 2),
}


def matched_timing(block_size: int) -> dict[str, Any]:
    """dynask mocker arguments that reproduce Dynamo's mocker at speed-up 1."""
    return {
        "block_size": block_size,
        "num_kv_blocks": 16384,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "prefill_ms_base": 16.5,
        "prefill_ms_per_token": 0.0152,
        "prefill_quadratic_ms": 4.2e-7,
        "decode_ms_base": 5.74,
        "decode_ms_per_active_block": 0.0,
        "decode_ms_per_kv_usage": 54.01,
        "decode_ms_per_kv_usage_squared": -25.74,
        "speedup_ratio": 1.0,
    }


@contextmanager
def dynask_server(
    args: argparse.Namespace, workdir: Path
) -> Iterator[tuple[dict[str, list[str]], list[int]]]:
    """One ``bench.routing.server`` with the control planes the dynask targets need: their
    base URLs, ``{"synced": [...], "unsynced": [...]}`` (the first synced one always), and
    its process group (control planes and Dask workers)."""
    wanted = {"synced": 1, "unsynced": 0}
    for system, _ in args.target_list:
        if system in DYNASK_PLANES:
            kind, count = DYNASK_PLANES[system]
            wanted[kind] = max(wanted[kind], count)
    ports = {kind: [free_port() for _ in range(count)] for kind, count in wanted.items()}
    argv = [
        str(PYTHON),
        *("-m", "bench.routing.server", "--engine", "mocker"),
        *("--engine-args", json.dumps(matched_timing(args.block_size) | args.dynask_engine_args)),
        *("--actors", str(args.actors), "--workers", str(args.workers)),
    ]
    for port in ports["synced"]:
        argv += ["--port", str(port)]
    for port in ports["unsynced"]:
        argv += ["--unsynced-port", str(port)]
    for flag_name, value in (
        ("--kv-overlap-weight", args.kv_overlap_weight),
        ("--kv-decode-weight", args.kv_decode_weight),
        ("--kv-recompute-weight", args.kv_recompute_weight),
    ):
        if value is not None:
            argv += [flag_name, value]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with spawned("dynask-server", argv, workdir, env) as server:
        urls = {kind: [f"http://127.0.0.1:{p}" for p in group] for kind, group in ports.items()}
        for url in urls["synced"] + urls["unsynced"]:
            wait_until_ready(f"{url}/health", '"ready"', READY_TIMEOUT_S, [server])
        yield urls, [server.pid]


def dynamo_model_dir(workdir: Path) -> Path:
    """The peer's SmolLM2 tokenizer folder with a context long enough for the trace."""
    source = DYNAMO_HOME / "smollm2-tok"
    if not (source / "tokenizer.json").exists():
        raise SystemExit(f"{source} is missing: run {DYNAMO_SCRIPTS / 'dynamo.sh'} setup")
    target = workdir / "smollm2-tok-long"
    if not target.exists():
        shutil.copytree(source, target)
        config = json.loads((target / "config.json").read_text())
        config["max_position_embeddings"] = 262144
        (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


@contextmanager
def dynamo_stack(
    args: argparse.Namespace, mode: str, workdir: Path
) -> Iterator[tuple[str, list[int]]]:
    """Dynamo's frontend (``mode``) and one mocker process of ``--actors`` workers: the
    URL and their process groups."""
    port = free_port()
    kv_dir = workdir / f"kvstore-{mode}"
    shutil.rmtree(kv_dir, ignore_errors=True)
    kv_dir.mkdir(parents=True)
    router = "kv --no-router-kv-events" if mode == "approximate" else mode
    frontend = (
        f"-m dynamo.frontend --http-host 127.0.0.1 --http-port {port} "
        f"--router-mode {router} --kv-cache-block-size {args.block_size}"
    )
    mocker = (
        f"-m dynamo.mocker --model-path {dynamo_model_dir(workdir)} --model-name {DYNAMO_MODEL} "
        f"--num-workers {args.actors} --block-size {args.block_size} --speedup-ratio 1 "
        "--num-gpu-blocks-override 16384 --max-num-seqs 256 --max-num-batched-tokens 8192"
    )
    python = DYNAMO_HOME / "venv" / "bin" / "python"
    with ExitStack() as stack:
        started = []
        for name, module_args in (("frontend", frontend), ("mocker", mocker)):
            script = (
                f'. "{DYNAMO_SCRIPTS / "env.sh"}" && export DYN_FILE_KV="{kv_dir}" && '
                f'exec "{python}" {module_args}'
            )
            argv = ["bash", "-c", script]
            started.append(stack.enter_context(spawned(f"dynamo-{name}-{mode}", argv, workdir)))
        base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(f"{base_url}/v1/models", DYNAMO_MODEL, READY_TIMEOUT_S, started)
        time.sleep(5.0)  # the model is listed once one worker registered; let all of them
        yield base_url, [process.pid for process in started]
