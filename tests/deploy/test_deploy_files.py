"""deploy/systemd, deploy/container and deploy/kubernetes, validated offline.

- Every Kubernetes manifest against the Kubernetes schemas (``kubernetes-validate``,
  strict: an unknown field fails), the ``DaskCluster`` against the operator's own CRD
  schema (vendored in ``crds/``; unknown fields fail as with ``kubectl --validate=strict``).
- Every systemd unit with ``systemd-analyze verify`` (its ``/opt/dynask`` prefix pointed at
  this virtual environment, so the programs it names exist).
- Every command line in these files (``dynask ...``, ``dask scheduler|worker ...``) is
  accepted by the parser of the program it runs: our CLI's, distributed's click commands.
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import jsonschema
import kubernetes_validate
import pytest
import yaml
from distributed.cli import dask_scheduler, dask_worker

from dynask.control_plane.cli.main import parse
from dynask.control_plane.cluster.deploy_file import read_deploy_file
from tests.system_tools import require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
CONTAINER = DEPLOY / "container"
CRD = Path(__file__).parent / "crds" / "daskcluster.yaml"
VENV = Path(sys.executable).parent.parent


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) of every resource the kustomization lists."""
    listed = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"
    ), "kustomization.yaml does not list every manifest"
    return [
        (name, doc)
        for name in listed
        for doc in yaml.safe_load_all((KUBERNETES / name).read_text())
        if doc is not None
    ]


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused where Kubernetes would prune them."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _crd_validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # What every resource has besides its CRD's own fields (the API server checks them).
    schema["properties"] |= {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    return jsonschema.Draft7Validator(schema)


def _validate(doc: dict[str, Any]) -> list[str]:
    """The validation errors of one resource (empty: valid)."""
    if doc["kind"] == "DaskCluster":
        assert doc["apiVersion"] == "kubernetes.dask.org/v1"
        return [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in _crd_validator().iter_errors(doc)
        ]
    try:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


@pytest.mark.parametrize("name,doc", manifests(), ids=[f"{n}:{d['kind']}" for n, d in manifests()])
def test_every_manifest_is_valid(name: str, doc: dict[str, Any]) -> None:
    assert _validate(doc) == [], name


def test_the_validators_refuse_a_misspelt_field() -> None:
    """The checks above can fail: one wrong field name in each kind of resource."""
    docs = {doc["kind"]: doc for _, doc in manifests()}
    deployment = copy.deepcopy(docs["Deployment"])
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGet"]["paht"] = probe["httpGet"].pop("path")
    assert _validate(deployment) != []
    cluster = copy.deepcopy(docs["DaskCluster"])
    cluster["spec"]["worker"]["replica"] = cluster["spec"]["worker"].pop("replicas")
    assert any("replica" in error for error in _validate(cluster))
    cluster = copy.deepcopy(docs["DaskCluster"])
    cluster["spec"]["worker"]["replicas"] = "two"
    assert _validate(cluster) != []


def test_the_kubernetes_files_have_what_an_operator_needs() -> None:
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in manifests()}
    plane = docs[("Deployment", "dynask-control-plane")]["spec"]["template"]
    (container,) = plane["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/live"
    assert plane["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    assert plane["spec"]["securityContext"]["runAsNonRoot"] is True
    worker = docs[("DaskCluster", "dynask")]["spec"]["worker"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert worker["command"][worker["command"].index("--resources") + 1] == "GPU=1"
    # The control plane reaches the operator's scheduler Service (<cluster>-scheduler).
    scheduler = container["command"][container["command"].index("--scheduler") + 1]
    assert scheduler == "tcp://dynask-scheduler.dynask.svc.cluster.local:8786"
    assert "DATABASE_URL" in docs[("Secret", "dynask-db")]["stringData"]


def test_the_configmaps_deploy_file_is_read_by_dynask(tmp_path: Path) -> None:
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in manifests()}
    path = tmp_path / "deploy.yaml"
    path.write_text(docs[("ConfigMap", "dynask-deployments")]["data"]["deploy.yaml"])
    plans = read_deploy_file(str(path))
    assert [(p.name, p.engine, p.model, p.replicas) for p in plans] == [
        ("smollm2", "torch", "HuggingFaceTB/SmolLM2-135M-Instruct", 2)
    ]


# ---- command lines ---------------------------------------------------------------


def _env_file() -> dict[str, str]:
    pairs = [
        line.split("=", 1)
        for line in (SYSTEMD / "dynask.env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return dict(pairs)


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv) of every dynask/dask command these files run."""
    found: list[tuple[str, list[str]]] = []
    env = _env_file()
    for unit in sorted(SYSTEMD.glob("*.service")):
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart="):
                text = line.removeprefix("ExecStart=").replace("%i", "0").replace("%H", "host")
                text = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text)
                found.append((unit.name, shlex.split(text)))
    for name, doc in manifests():
        spec = doc.get("spec", {})
        pods = (
            [spec["scheduler"]["spec"], spec["worker"]["spec"]]
            if name == "dask-cluster.yaml"
            else []
        )
        if doc["kind"] == "Deployment":
            pods.append(spec["template"]["spec"])
        for pod in pods:
            for container in pod["containers"]:
                found.append((f"{name}:{container['name']}", container["command"]))
    for recipe in sorted(CONTAINER.glob("Containerfile*")):
        text = recipe.read_text()
        entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
        cmd = yaml.safe_load(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
        found.append((recipe.name, [*entry, *cmd]))
        for line in re.findall(r"^#\s+docker run (.*)$", text, re.M):
            argv = shlex.split(line, comments=True)
            image = next(a for a in argv if a.startswith("dynask:"))
            rest = argv[argv.index(image) + 1 :] or cmd  # no arguments: the image's CMD
            program = argv[argv.index("--entrypoint") + 1] if "--entrypoint" in argv else "dynask"
            found.append((f"{recipe.name} (comment)", [program, *rest]))
    return found


def _accepts(argv: list[str]) -> None:
    program = Path(argv[0]).name
    if program == "dynask":
        parse(argv[1:])  # SystemExit on a mistake
        return
    assert program == "dask", argv
    command = {"scheduler": dask_scheduler.main, "worker": dask_worker.main}[argv[1]]
    context = command.make_context(f"dask {argv[1]}", argv[2:])
    # dask worker ignores unknown options only until its positional argument: none here
    # may be taken for the scheduler's address.
    address = context.params.get("scheduler")
    assert address is None or re.match(r"tcp://", address), argv
    assert not context.params.get("preload_argv"), argv


@pytest.mark.parametrize("where,argv", command_lines(), ids=[w for w, _ in command_lines()])
def test_every_command_line_is_accepted_by_its_parser(where: str, argv: list[str]) -> None:
    _accepts(argv)


def test_a_wrong_flag_is_refused() -> None:
    with pytest.raises(SystemExit):
        _accepts(["dynask", "serve", "--scheduler", "tcp://h:8786", "--deploy", "x.yaml"])
    with pytest.raises(click.NoSuchOption):
        _accepts(["dask", "worker", "tcp://h:8786", "--gpus", "1"])


def test_every_file_is_covered() -> None:
    wheres = {where.split(":")[0].split(" ")[0] for where, _ in command_lines()}
    assert wheres == {
        "dask-scheduler.service",
        "dask-worker@.service",
        "dynask-control-plane.service",
        "dask-cluster.yaml",
        "control-plane.yaml",
        "Containerfile",
        "Containerfile.cuda",
    }


# ---- systemd and containers ------------------------------------------------------


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    analyze = require("systemd-analyze")
    for unit in SYSTEMD.glob("*.service"):
        text = unit.read_text().replace("/opt/dynask/.venv", str(VENV))
        (tmp_path / unit.name).write_text(text)
    (tmp_path / "dask-worker@0.service").symlink_to(tmp_path / "dask-worker@.service")
    units = [str(tmp_path / n) for n in ("dask-scheduler.service", "dask-worker@0.service")]
    units.append(str(tmp_path / "dynask-control-plane.service"))
    done = subprocess.run(
        [analyze, "verify", "--man=no", *units], capture_output=True, text=True, timeout=120
    )
    # Warnings (an unknown key, a bad value) print without failing: none may print.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_worker_unit_pins_its_gpu() -> None:
    text = (SYSTEMD / "dask-worker@.service").read_text()
    assert "Environment=CUDA_VISIBLE_DEVICES=%i" in text
    assert "--resources GPU=1" in text


@pytest.mark.parametrize("recipe", ["Containerfile", "Containerfile.cuda"])
def test_the_images_run_as_a_user_and_copy_what_exists(recipe: str) -> None:
    lines = (CONTAINER / recipe).read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users == ["dynask"]
    assert lines.index("USER dynask") < next(
        i for i, line in enumerate(lines) if line.startswith("ENTRYPOINT")
    )
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), line
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
