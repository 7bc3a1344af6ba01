"""``deploy.yaml``: the deployments ``dynask serve`` puts on a cluster.

    deployments:
      - name: smollm2              # lowercase letters, digits, dashes
        model: /models/SmolLM2     # HF folder, .gguf file or hub id, as seen by the workers
        model_name: smollm2        # what clients send as "model" (default: the name)
        engine: torch              # torch | echo | mocker | python:FILE.py
        replicas: 2                # one engine actor per worker
        role: aggregated           # aggregated | prefill | decode (disaggregated serving)
        engine_args: {kv_cache_gib: 2}

Every mistake is reported with the deployment, key and value it concerns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dynask.control_plane.cluster.plan import engine_spec
from dynask.control_plane.state.deployment import BUNDLED_MODEL, DeploymentSpec, parse_role

_KEYS = ("name", "model", "model_name", "engine", "replicas", "engine_args", "role")


def read_deploy_file(path: str) -> list[DeploymentSpec]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"deploy file '{path}' does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"deploy file '{path}' is not valid YAML: {exc}") from exc
    items = data.get("deployments") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"deploy file '{path}' needs a non-empty 'deployments' list")
    return [_deployment(item, index, path) for index, item in enumerate(items)]


def _deployment(item: Any, index: int, path: str) -> DeploymentSpec:
    from dynask.actors.runtime.engine_factory import parse_engine

    where = f"{path}: deployments[{index}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be a mapping with at least 'name'")
    unknown = sorted(set(item) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where} has unknown key '{unknown[0]}'; known: {', '.join(_KEYS)}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} needs a 'name'")
    replicas = item.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise ValueError(
            f"{where} ({name}) 'replicas' has value {replicas!r}; expected an integer >= 0"
        )
    engine_args = item.get("engine_args") or {}
    if not isinstance(engine_args, dict):
        raise ValueError(f"{where} ({name}) 'engine_args' must be a mapping")
    try:
        kind, python_file = parse_engine(str(item.get("engine", "torch")))
        deployment = DeploymentSpec(
            name=name,
            model=item.get("model") or BUNDLED_MODEL,
            engine=kind,
            role=parse_role(item.get("role", "aggregated"), f"{where} ({name})"),
            replicas=replicas,
            engine_args=engine_args,
            served_model_name=str(item.get("model_name") or name),
            engine_file=python_file,
        )
        engine_spec(deployment)  # the engine factory's own checks, now
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where} ({name}): {exc}") from exc
    return deployment
