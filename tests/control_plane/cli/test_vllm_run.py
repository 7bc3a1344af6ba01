"""``dynask run out=vllm``: the command a user types, with its real worker processes.

The embedded cluster's workers are started by Nannies, so they are daemon processes;
vLLM must still start its engine-core processes there, and leave none behind.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.control_plane.server_process import dynask_run

pytestmark = pytest.mark.slow


def test_dynask_run_serves_vllm_and_leaves_no_process_behind(tmp_path: Path) -> None:
    args = ["out=vllm", "--kv-cache-gib", "0.25", "--max-model-len", "100000"]
    with dynask_run(tmp_path, args) as (base, proc):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
        prompt = "Tell me about the history of Paris. " * 20  # several of vLLM's blocks
        cached = [_cached_tokens(client, prompt) for _ in range(2)]
        reset = httpx.post(f"{base}/v1/engines/reset_prefix_cache", timeout=60)
        cached.append(_cached_tokens(client, prompt))
        group = proc.pid  # started in a session of its own: workers and vLLM's children too

    assert "Paris" in (reply.choices[0].message.content or "")
    assert cached[0] == 0 and cached[1] > 0, cached  # vLLM's own prefix cache hit...
    assert reset.status_code == 200, reset.text
    assert reset.json()["engines"][0]["reset"] is True
    assert cached[2] == 0  # ...and emptied by the reset
    log = (tmp_path / "dynask-run.log").read_text()
    assert "max_model_len 100000 does not fit this engine" in log  # clamped, not crashed
    assert _group_gone(group), "processes of dynask run outlived it"


def _cached_tokens(client: openai.OpenAI, prompt: str) -> int:
    reply = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=2, temperature=0
    )
    details = reply.usage.prompt_tokens_details if reply.usage else None
    return details.cached_tokens or 0 if details else 0


def _group_gone(group: int, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False
