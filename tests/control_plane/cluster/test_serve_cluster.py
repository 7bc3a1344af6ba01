"""``dynask serve`` against a real cluster: ``dask scheduler`` + two ``dask worker`` processes.

``serve`` requires an API key by default: the test makes one with ``dynask keys create``
against the same database first, and the ``openai`` client sends it.

Also: a restarted control plane without a deploy file restores its deployments from the
database, and ``dynask db upgrade`` migrates a fresh database.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.control_plane import server_process as sp
from tests.control_plane.state.test_migrations import HEAD

pytestmark = pytest.mark.slow


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[str]:
    port = sp.free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [
        sp.start(
            [
                str(sp.BIN / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-dashboard",
            ],
            tmp_path / "scheduler.log",
        )
    ]
    try:
        for name in ("w1", "w2"):
            procs.append(
                sp.start(
                    [
                        str(sp.BIN / "dask"),
                        "worker",
                        address,
                        "--name",
                        name,
                        "--nthreads",
                        "1",
                        "--no-dashboard",
                        "--memory-limit",
                        "0",
                    ],
                    tmp_path / f"{name}.log",
                )
            )
        yield address
    finally:
        for proc in reversed(procs):
            sp.stop(proc)


def _serve(
    scheduler: str, tmp_path: Path, db: str, *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = sp.free_port()
    log = tmp_path / f"serve-{port}.log"
    proc = sp.start(
        [
            str(sp.BIN / "dynask"),
            "serve",
            "--scheduler",
            scheduler,
            "--port",
            str(port),
            "--database-url",
            db,
            *extra,
        ],
        log,
    )
    base = f"http://127.0.0.1:{port}"
    sp.wait_healthy(base, proc, log)
    return proc, base


def _create_key(db: str) -> str:
    done = subprocess.run(
        [str(sp.BIN / "dynask"), "keys", "create", "serve-test", "--database-url", db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_serve_on_a_real_cluster_then_restore_from_the_database(
    dask_cluster: str, tiny_llama_folder: Path, tmp_path: Path
) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "deployments:\n"
        "  - name: tiny\n"
        f"    model: {tiny_llama_folder}\n"
        "    replicas: 2\n"
        "    engine_args: {kv_cache_gib: 0.05}\n"
    )
    db = f"sqlite:///{tmp_path / 'state.db'}"
    key = _create_key(db)

    proc, base = _serve(dask_cluster, tmp_path, db, "-f", str(deploy))
    try:
        assert httpx.get(f"{base}/v1/models").status_code == 401  # keys are on by default
        engines = sp.wait_for_engines(base, 2, api_key=key)
        assert len({e["worker"] for e in engines}) == 2  # one actor per worker
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        assert not sp.maps_torch(proc.pid)  # the engines' workers load torch, serve never
    finally:
        sp.stop(proc)

    restarted, base = _serve(dask_cluster, tmp_path, db)  # no -f: from the database
    try:
        sp.wait_for_engines(base, 2, api_key=key)
        auth = {"authorization": f"Bearer {key}"}
        models = httpx.get(f"{base}/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["tiny"]
    finally:
        sp.stop(restarted)


def test_db_upgrade_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    done = subprocess.run(
        [str(sp.BIN / "dynask"), "db", "upgrade", "--database-url", db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{db}: schema revision {HEAD}"


def test_serve_without_deployments_says_what_to_do(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    done = subprocess.run(
        [str(sp.BIN / "dynask"), "serve", "--scheduler", "tcp://127.0.0.1:1", "--database-url", db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no deployments: pass -f deploy.yaml" in done.stderr
