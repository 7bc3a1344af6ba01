"""The ``dynask`` command as a user meets it: a terminal chat, a batch file, bad arguments."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynask.control_plane.cli.main import main, normalize_dynamo_args

DYNASK = [sys.executable, "-m", "dynask.control_plane.cli.main"]


def test_dynamo_style_arguments_become_flags() -> None:
    assert normalize_dynamo_args(["m.gguf", "in=text", "out=torch", "--x=1"]) == [
        "m.gguf",
        "--in",
        "text",
        "--out",
        "torch",
        "--x=1",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "in=voice"],
            "in=voice is not an input mode; use one of: in=http, in=text, in=batch:FILE.jsonl, "
            "in=dyn://POOL",
        ),
        (
            ["run", "out=sglang"],
            "engine 'sglang' is not known; valid: torch, vllm, echo, mocker, python:FILE.py, "
            "openai:URL",
        ),
        (["run", "in=batch:"], "in=batch: needs a file, e.g. in=batch:prompts.jsonl"),
        (["run", "/no/such/model.gguf"], "model path '/no/such/model.gguf' does not exist"),
        (
            ["run", "out=vllm", "--tensor-parallel-size", "0"],
            "VLLMArgs 'tensor_parallel_size' has value 0; expected an int >= 1",
        ),
        (
            ["run", "out=vllm", "--device", "cuda"],
            "engine argument 'device' is not known to out=vllm; known: block_size, dtype",
        ),
    ],
)
def test_bad_arguments_say_what_is_wrong(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    assert f"dynask: error: {message}" in capsys.readouterr().err


def test_batch_file_results_are_written_beside_it(tiny_llama_folder: Path, tmp_path: Path) -> None:
    batch = tmp_path / "prompts.jsonl"
    batch.write_text(
        json.dumps({"prompt": "Hello there", "max_tokens": 5})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        + "\n"
    )

    done = subprocess.run(
        [*DYNASK, "run", str(tiny_llama_folder), f"in=batch:{batch}", "--temperature", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    results = [
        json.loads(line) for line in (tmp_path / "prompts.results.jsonl").read_text().splitlines()
    ]
    assert [(r["line"], r["completion_tokens"]) for r in results] == [(1, 5), (3, 3)]
    assert "batch: 100%" in done.stderr and " tok/s]" in done.stderr  # the progress bar
    assert re.search(r"results to \S+ \(8 output tokens, \d+\.\d tokens/s\)", done.stderr)
    assert all(
        r["finish_reason"] in ("length", "stop") and isinstance(r["text"], str) for r in results
    )


@pytest.mark.slow  # a cluster of one worker process
def test_batch_runs_any_engine_through_the_serving_pipeline(
    smollm2_folder: Path, tmp_path: Path
) -> None:
    batch = tmp_path / "echo.jsonl"
    lines = ["The quick brown fox", "jumps over the lazy dog"]
    batch.write_text("".join(json.dumps({"prompt": p, "max_tokens": 50}) + "\n" for p in lines))

    done = subprocess.run(
        [*DYNASK, "run", str(smollm2_folder), "out=echo", f"in=batch:{batch}"],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    results = [
        json.loads(line) for line in (tmp_path / "echo.results.jsonl").read_text().splitlines()
    ]
    assert [(r["line"], r["text"], r["finish_reason"]) for r in results] == [
        (1, lines[0], "stop"),
        (2, lines[1], "stop"),
    ]
    assert [r["prompt_tokens"] for r in results] == [r["completion_tokens"] for r in results]


def test_batch_file_with_a_bad_line_names_the_line(tiny_llama_folder: Path, tmp_path: Path) -> None:
    batch = tmp_path / "bad.jsonl"
    batch.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')

    done = subprocess.run(
        [*DYNASK, "run", str(tiny_llama_folder), f"in=batch:{batch}"],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 2
    assert 'batch line 2 needs a "prompt" or a "messages" field' in done.stderr


def _read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"waited for {marker!r}; saw {seen[-500:]!r}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_text_chat_in_a_pseudo_terminal(smollm2_folder: Path) -> None:
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [*DYNASK, "run", "in=text", "--temperature", "0", "--max-tokens", "20"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        close_fds=True,
    )
    os.close(terminal)
    try:
        _read_until(controller, b"you> ", timeout=300)
        os.write(controller, b"What is the capital of France?\n")
        reply = _read_until(controller, b"you> ", timeout=120)
        os.write(controller, b"exit\n")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        os.close(controller)

    assert b"model> The capital of France is Paris" in reply


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--router-mode", "sticky"], "argument --router-mode: invalid choice: 'sticky'"),
        (["--kv-overlap-weight", "-1"], "argument --kv-overlap-weight: has value '-1'; expected"),
        (["--max-queue", "0"], "argument --max-queue: has value '0'; expected an integer >= 1"),
    ],
)
def test_bad_routing_flags_name_the_flag(flags: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--scheduler", "tcp://127.0.0.1:1", *flags])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_offload_tier_size_names_the_setting(tiny_llama_folder: Path, capsys) -> None:
    argv = ["run", str(tiny_llama_folder), "in=text", "--kv-host-gb", "-1"]
    assert main(argv) == 2
    assert (
        "dynask: error: EngineConfig 'kv_host_gb' has value -1.0; expected a number >= 0 (0: off)"
        in capsys.readouterr().err
    )
