"""``dynask run --otel-endpoint``: a real control plane process and a real Dask worker
process export one trace per request to a collector, joined to the client's span.

The collector is ``bench.common.otlp_receiver`` on a local port (the real OTLP/HTTP
exporter on both sides); the client is the official ``openai`` client with a W3C
``traceparent`` header.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from bench.common.otlp_receiver import OtlpReceiver
from tests.control_plane import server_process as sp

pytestmark = pytest.mark.slow  # starts dynask run (a cluster, a worker process)

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


def test_dynask_run_exports_the_control_plane_and_engine_spans_of_one_trace(
    tmp_path: Path, tiny_llama_folder: Path
) -> None:
    collector = OtlpReceiver()
    endpoint = collector.url.removesuffix("/v1/traces")
    args = [
        "out=mocker",
        str(tiny_llama_folder),
        "--model-name",
        "tiny",
        "--otel-endpoint",
        endpoint,
    ]
    try:
        with sp.dynask_run(tmp_path, args) as (base, _):
            sp.wait_for_engines(base, 1)
            client = openai.OpenAI(
                base_url=f"{base}/v1",
                api_key="unused",
                default_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
            )
            reply = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
            )
            spans = collector.wait_for(8)
    finally:
        collector.close()
    mine = [s for s in spans if s.trace_id == TRACE_ID]
    names = {s.span_id: s.name for s in mine}
    tree = sorted((s.service, s.name, names.get(s.parent_span_id, s.parent_span_id)) for s in mine)
    assert tree == [
        ("dynask", "POST /v1/chat/completions", CLIENT_SPAN),
        ("dynask", "generate", "POST /v1/chat/completions"),
        ("dynask", "prepare", "POST /v1/chat/completions"),
        ("dynask", "route", "POST /v1/chat/completions"),
        ("dynask-engine", "engine.decode", "engine.request"),
        ("dynask-engine", "engine.prefill", "engine.request"),
        ("dynask-engine", "engine.queue", "engine.request"),
        ("dynask-engine", "engine.request", "generate"),
    ]
    (request,) = [s for s in mine if s.name == "engine.request"]
    assert request.attributes["dynask.request_id"] == reply.id
    assert request.attributes["dynask.completion_tokens"] == reply.usage.completion_tokens
    assert request.attributes["dynask.prompt_tokens"] == reply.usage.prompt_tokens
