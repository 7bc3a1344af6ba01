"""A model path that exists only on a worker, added from the admin UI of ``dynask serve``.

On a cluster the models live on the GPU hosts, not on the control plane's. A real ``dask
scheduler`` and two ``dask worker`` processes: the first holds the deploy file's
deployment; the second, started after it, runs with a HOME of its own that holds
``~/models/smol`` (a copy of the bundled model's folder), which neither the control
plane's host nor the first worker has. The admin form takes that path (it is asked of
the workers), the deployment's actor loads it on the second worker and serves the
``openai`` client; a path no host has is refused, naming where it was looked for. With
both workers free, a deploy file's deployment of that path fails on the worker tried
first and starts on the one that has it.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from distributed import Client

from tests.control_plane import server_process as sp
from tests.control_plane.dask_processes import DaskProcesses, dask_cluster  # noqa: F401
from tests.web.admin_stack import log_in

pytestmark = pytest.mark.slow

PASSWORD = "worker-model-paths"
WORKER_MODEL = "~/models/smol"
DEPLOY = "deployments:\n  - name: first\n    engine: echo\n    model: {model}\n    replicas: 1\n"


def _field_errors(page: str) -> dict[str, str]:
    found = re.findall(r'<div class="field-error" id="error-(\w+)">([^<]*)</div>', page)
    return {name: html.unescape(message) for name, message in found}


def _create(admin: httpx.Client, csrf: str, name: str, model: str) -> httpx.Response:
    form = {
        "name": name,
        "model": model,
        "engine": "mocker",
        "role": "aggregated",
        "replicas": "1",
        "engine_args": '{"speedup_ratio": 0}',
        "csrf_token": csrf,
    }
    return admin.post("/admin/deployments", data=form)


def _engines(base: str) -> list[dict[str, Any]]:
    engines: list[dict[str, Any]] = httpx.get(f"{base}/v1/engines", timeout=30).json()
    return engines


def _ready_workers(base: str, deployment: str) -> dict[str, str]:
    """The ready actors of ``deployment`` (/v1/engines lists only those): name -> worker."""
    return {e["name"]: e["worker"] for e in _engines(base) if e["deployment"] == deployment}


def _serve(
    dask_cluster: DaskProcesses,  # noqa: F811
    tmp_path: Path,
    deploy: str,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``dynask serve`` of ``deploy`` on the cluster: (process, base URL, log), healthy."""
    (tmp_path / "deploy.yaml").write_text(deploy)
    port = sp.free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [str(sp.BIN / "dynask"), "serve", "--scheduler", dask_cluster.address]
    argv += ["--port", str(port), "--no-require-api-key", "-f", str(tmp_path / "deploy.yaml")]
    argv += ["--database-url", f"sqlite:///{tmp_path / 'state.db'}"]
    log = tmp_path / "serve.log"
    proc = sp.start(argv, log, env)
    try:
        sp.wait_healthy(base, proc, log)
    except BaseException:
        sp.stop(proc)
        raise
    return proc, base, log


def _placed_and_served(base: str, deployment: str) -> tuple[dict[str, str], int | None]:
    """Waits (up to 120 s) for ``deployment``'s ready actors, then asks it for 5 tokens:
    (its actors by worker, as ``_ready_workers``; the tokens the ``openai`` client got)."""
    deadline = time.monotonic() + 120
    while not _ready_workers(base, deployment) and time.monotonic() < deadline:
        time.sleep(0.25)
    placed = _ready_workers(base, deployment)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(
        model=deployment, prompt="The sky is", max_tokens=5, extra_body={"ignore_eos": True}
    )
    return placed, None if completion.usage is None else completion.usage.completion_tokens


def test_a_path_only_a_worker_has_is_deployed_there(
    dask_cluster: DaskProcesses,  # noqa: F811
    tmp_path: Path,
    smollm2_folder: Path,
) -> None:
    worker_home = tmp_path / "worker-home"
    shutil.copytree(smollm2_folder, worker_home / "models" / "smol")
    assert not Path(WORKER_MODEL).expanduser().exists()  # not on this host
    dask_cluster.start_worker("plain")
    deploy = DEPLOY.format(model=smollm2_folder)
    proc, base, _ = _serve(dask_cluster, tmp_path, deploy, {"DYNASK_ADMIN_PASSWORD": PASSWORD})
    try:  # ``first`` holds the plain worker
        with_model = dask_cluster.start_worker("with-model", {"HOME": str(worker_home)})
        with Client(dask_cluster.address, timeout=60) as dask:
            dask.wait_for_workers(2, timeout=60)
        with httpx.Client(base_url=base, timeout=60, follow_redirects=False) as admin:
            csrf = log_in(admin, PASSWORD)

            missing = _create(admin, csrf, "nowhere", "~/models/none")
            created = _create(admin, csrf, "smol", WORKER_MODEL)

            assert missing.status_code == 400
            assert _field_errors(missing.text) == {
                "model": "'~/models/none' is neither an existing folder or .gguf file nor a "
                "hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct' (on this host and on "
                "all 2 workers)"
            }
            assert created.status_code == 303, _field_errors(created.text)
        placed, tokens = _placed_and_served(base, "smol")

        assert placed == {"smol-0": with_model}
        assert tokens == 5
    finally:
        sp.stop(proc)


def test_a_start_that_fails_on_one_worker_goes_on_to_the_next(
    dask_cluster: DaskProcesses,  # noqa: F811
    tmp_path: Path,
    smollm2_folder: Path,
) -> None:
    """The reconciler tries free workers in address order: the one without the model
    first. Before, its failure ended the round and every round tried that worker again."""
    worker_home = tmp_path / "worker-home"
    shutil.copytree(smollm2_folder, worker_home / "models" / "smol")
    ports = sorted((sp.free_port(), sp.free_port()), key=lambda port: f"tcp://127.0.0.1:{port}")
    plain = dask_cluster.start_worker("plain", port=ports[0])
    with_model = dask_cluster.start_worker("with-model", {"HOME": str(worker_home)}, ports[1])
    with Client(dask_cluster.address, timeout=60) as dask:
        dask.wait_for_workers(2, timeout=60)
    deploy = DEPLOY.replace("echo", "mocker").format(model=WORKER_MODEL).replace("first", "smol")
    proc, base, log = _serve(dask_cluster, tmp_path, deploy)
    try:
        placed, tokens = _placed_and_served(base, "smol")

        assert placed == {"smol-1": with_model}  # smol-0 failed on the plain worker
        assert tokens == 5
        assert f"engine actor smol-0 failed to start on {plain}" in log.read_text()
    finally:
        sp.stop(proc)
