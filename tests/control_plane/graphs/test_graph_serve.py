"""``dynask serve MODULE:Component -f CONFIG.yaml`` end to end: the shipped example graphs
on a real ``dask scheduler`` and two ``dask worker`` processes, with the ``openai`` client.

The graphs are the shipped ``deploy/graphs/*.py``; their YAML here swaps the bundled
model for the tiny test model with the echo / mocker engine (no weights to run on 2 CPU
cores). The shipped YAML files are validated in ``test_graph_sdk``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from dynask.control_plane.graphs.store import stored_graphs
from dynask.control_plane.state.database import make_engine
from tests.control_plane import server_process as sp
from tests.control_plane.dask_processes import DaskProcesses

pytestmark = pytest.mark.slow

GRAPHS = Path(__file__).resolve().parents[3] / "deploy" / "graphs"


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster = DaskProcesses(tmp_path_factory.mktemp("graph-cluster"))
    try:
        address = cluster.start_scheduler()
        cluster.start_worker("w1")
        cluster.start_worker("w2")
        yield address
    finally:
        cluster.stop_all()


def _serve_graph(
    scheduler: str, tmp_path: Path, graph: str, config: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    yaml_file = tmp_path / f"{graph}.yaml"
    yaml_file.write_text(config)
    port = sp.free_port()
    db = f"sqlite:///{tmp_path / 'state.db'}"
    log = tmp_path / f"serve-{graph}.log"
    argv = [str(sp.BIN / "dynask"), "serve", f"{GRAPHS / graph}.py:Frontend", "-f"]
    argv += [str(yaml_file), "--scheduler", scheduler, "--port", str(port)]
    proc = sp.start([*argv, "--database-url", db, "--no-require-api-key"], log)
    base = f"http://127.0.0.1:{port}"
    sp.wait_healthy(base, proc, log)
    return proc, base, db


def _chat(base: str, content: str) -> str:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=40
    )
    return reply.choices[0].message.content or ""


def test_agg_graph_serves_and_is_stored(
    dask_cluster: str, tiny_llama_folder: Path, tmp_path: Path
) -> None:
    config = (
        f"Common: {{model: {tiny_llama_folder}, engine: echo}}\n"
        "Frontend: {served_model_name: tiny}\n"
        "AggProcessor: {router: round-robin}\n"
        "LLMWorker:\n  common-configs: [model, engine]\n  ServiceArgs: {workers: 2}\n"
    )
    proc, base, db = _serve_graph(dask_cluster, tmp_path, "agg", config)
    try:
        engines = sp.wait_for_engines(base, 2)
        assert {e["deployment"] for e in engines} == {"agg-llmworker"}
        assert "hello graph" in _chat(base, "hello graph")
        (stored,) = stored_graphs(make_engine(db))
        assert stored["name"] == "agg"
        assert stored["links"] == [["Frontend", "AggProcessor"], ["AggProcessor", "LLMWorker"]]
    finally:
        sp.stop(proc)


def test_a_custom_processor_rewrites_the_prompt_in_an_actor(
    dask_cluster: str, tiny_llama_folder: Path, tmp_path: Path
) -> None:
    config = (
        "Frontend: {served_model_name: tiny}\n"
        "RewritingProcessor: {prefix: 'REWRITTEN '}\n"
        f"RewriteWorker: {{model: {tiny_llama_folder}, engine: echo}}\n"
    )
    proc, base, _ = _serve_graph(dask_cluster, tmp_path, "agg_rewrite", config)
    try:
        sp.wait_for_engines(base, 1)
        assert "REWRITTEN hi there" in _chat(base, "hi there")  # echo: the processed prompt
        completion = httpx.post(
            f"{base}/v1/completions",
            json={"model": "tiny", "prompt": "plain", "max_tokens": 10},
            timeout=60,
        ).json()
        assert completion["choices"][0]["text"].startswith("REWRITTEN plain")
        refused = httpx.post(
            f"{base}/v1/completions", json={"model": "other", "prompt": "x"}, timeout=60
        )
        assert refused.status_code == 400  # the processor's ValueError, named
        assert "this graph serves 'tiny', not 'other'" in refused.json()["error"]["message"]
    finally:
        sp.stop(proc)


def test_disagg_graph_serves_with_a_prefill_and_a_decode_engine(
    dask_cluster: str, tiny_llama_folder: Path, tmp_path: Path
) -> None:
    config = (
        f"Common: {{model: {tiny_llama_folder}, engine: mocker, speedup-ratio: 100.0}}\n"
        "Frontend: {served_model_name: tiny}\n"
        "Decode: {common-configs: [model, engine, speedup-ratio]}\n"
        "Prefill: {common-configs: [model, engine, speedup-ratio]}\n"
    )
    proc, base, _ = _serve_graph(dask_cluster, tmp_path, "disagg", config)
    try:
        engines = sp.wait_for_engines(base, 2)
        assert {e["deployment"] for e in engines} == {"disagg-decode", "disagg-prefill"}
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "a prompt " * 20}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 5
    finally:
        sp.stop(proc)
