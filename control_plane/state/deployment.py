"""What to deploy: ``DeploymentSpec``, the one deployment type, and its ``Role``.

A deploy file, ``dynask run``'s flags, an inference graph and the admin UI's form all make
a ``DeploymentSpec``; the repository stores it (as desired state), the reconciler makes
it real and the planner scales it. It is checked on construction, so a bad value never
reaches the database or the cluster. ``cluster.plan.engine_spec`` turns it into the
``EngineSpec`` the engine factory builds.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
BUNDLED_MODEL = "bundled:SmolLM2-135M-Instruct"  # the model of "no model given"
ENGINES = ("torch", "vllm", "mocker", "echo", "python", "openai")


class Role(enum.StrEnum):
    """What a deployment's engines do: all of a request, or one side of disaggregation."""

    AGGREGATED = "aggregated"
    PREFILL = "prefill"  # computes prompts' KV and sends it to a decode engine
    DECODE = "decode"  # generates, from KV it computed or received


ROLES = tuple(role.value for role in Role)


def parse_role(value: Any, where: str = "Deployment") -> Role:
    """``value`` as a Role; ValueError naming ``where`` and the value otherwise."""
    if isinstance(value, str) and value in ROLES:
        return Role(value)
    raise ValueError(f"{where} 'role' has value {value!r}; expected one of {', '.join(ROLES)}")


def _invalid(field_name: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"Deployment {field_name!r} has value {value!r}; expected {expected}")


def check_replicas(replicas: Any) -> None:
    """Raises ValueError unless ``replicas`` is an integer >= 0."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise _invalid("replicas", replicas, "an integer >= 0")


def check_engine_args(engine_args: Any) -> None:
    """Raises ValueError unless ``engine_args`` is a JSON object (string keys)."""
    try:
        ok = isinstance(engine_args, Mapping) and all(isinstance(k, str) for k in engine_args)
        json.dumps(engine_args)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise _invalid("engine_args", engine_args, "a JSON object with string keys")


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: what it runs, under which name, how many replicas, which role."""

    name: str
    model: str = BUNDLED_MODEL  # a folder, .gguf file or hub id
    engine: str = "torch"
    role: Role = Role.AGGREGATED
    replicas: int = 1
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    served_model_name: str | None = None  # what clients send as "model" (None: the name)
    engine_file: str | None = None  # the FILE.py of out=python, the URL of out=openai

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise _invalid(
                "name",
                self.name,
                "1-63 lowercase letters, digits or dashes, starting and ending with a "
                "letter or digit",
            )
        if not isinstance(self.model, str) or not 0 < len(self.model) <= 1024:
            raise _invalid("model", self.model, "a folder, .gguf file or hub id (1-1024 chars)")
        if self.engine not in ENGINES:
            raise _invalid("engine", self.engine, f"one of {', '.join(ENGINES)}")
        object.__setattr__(self, "role", parse_role(self.role))
        check_replicas(self.replicas)
        check_engine_args(self.engine_args)

    @property
    def model_name(self) -> str:
        """The name clients send as ``model``."""
        return self.served_model_name or self.name

    @property
    def model_path(self) -> str | None:
        """The model to load; None for the bundled one."""
        return None if self.model == BUNDLED_MODEL else self.model
