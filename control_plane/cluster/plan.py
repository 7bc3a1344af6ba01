"""What the reconciler builds for a deployment (``state.deployment.DeploymentSpec``, the
one deployment type): its ``EngineSpec``, and the model name clients use."""

from __future__ import annotations

from pathlib import Path

from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.state.deployment import DeploymentSpec


def engine_spec(deployment: DeploymentSpec) -> EngineSpec:
    """The engine each replica of ``deployment`` runs (ValueError if it cannot be one)."""
    return EngineSpec(
        kind=deployment.engine,
        model=deployment.model_path,
        python_file=deployment.engine_file if deployment.engine == "python" else None,
        engine_args=dict(deployment.engine_args),
        url=deployment.engine_file if deployment.engine == "openai" else None,
    )


def served_name(model: str | None) -> str:
    """The model name clients use: the file stem, folder name or hub id."""
    if not model:
        return "SmolLM2-135M-Instruct"
    path = Path(model)
    if path.exists():
        return path.stem.split(".")[0] if path.is_file() else path.name
    return model
