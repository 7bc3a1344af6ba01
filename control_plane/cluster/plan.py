"""The deployments the reconciler makes real: what each runs, how many replicas, which role."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dynask.actors.runtime.engine_factory import EngineSpec


@dataclass(frozen=True)
class DeploymentPlan:
    """One deployment as the runtime needs it."""

    name: str
    served_model_name: str
    spec: EngineSpec
    replicas: int = 1
    role: str = "aggregated"  # "prefill" / "decode": disaggregated (disagg_orchestrator)


def served_name(model: str | None) -> str:
    """The model name clients use: the file stem, folder name or hub id."""
    if not model:
        return "SmolLM2-135M-Instruct"
    path = Path(model)
    if path.exists():
        return path.stem.split(".")[0] if path.is_file() else path.name
    return model
