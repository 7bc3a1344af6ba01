"""The admin forms' fields: parsed from strings, checked, errors named by field.

A form that fails comes back with the values the user typed and one message per field,
shown next to that field; nothing reaches the database or the cluster before it passes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import FormData

from dynask.control_plane.cluster.deployment_admin import OPENAI_ARG_FIELDS, DeploymentInvalidError
from dynask.control_plane.state.deployment import (
    BUNDLED_MODEL,
    NAME_PATTERN,
    DeploymentSpec,
    parse_role,
)

MAX_REPLICAS = 64
DEPLOYMENT_FIELDS = ("name", "model", "served_model_name", "engine", "role", "replicas")
# out=openai:URL: the server's URL (kept as the deployment's engine_file, as the CLI does)
# and the engine arguments with fields of their own.
OPENAI_FIELDS = ("url", *OPENAI_ARG_FIELDS)


class FormErrors(ValueError):
    """One message per field name."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


@dataclass
class DeploymentForm:
    """What the create form holds: raw values (to show again) and per-field errors."""

    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> DeploymentForm:
        return cls({"engine": "mocker", "role": "aggregated", "replicas": "1", "engine_args": "{}"})

    @classmethod
    def from_form(cls, form: FormData) -> DeploymentForm:
        names = (*DEPLOYMENT_FIELDS, "engine_args", *OPENAI_FIELDS)
        return cls({name: str(form.get(name) or "").strip() for name in names})

    def with_error(self, error: DeploymentInvalidError | ValueError) -> DeploymentForm:
        name = error.field if isinstance(error, DeploymentInvalidError) else "name"
        return DeploymentForm(self.values, {**self.errors, name: str(error)})

    def _openai_target(
        self, engine: str, engine_args: dict[str, Any], errors: dict[str, str]
    ) -> str | None:
        """The server URL of an ``openai`` deployment (None for the other engines), its
        own fields merged into ``engine_args``; what is wrong goes to ``errors``."""
        values = self.values
        given = [name for name in OPENAI_FIELDS if values.get(name)]
        if engine != "openai":
            for name in given:
                errors[name] = f"only the openai engine takes this, not {engine}"
            return None
        if not values.get("url"):
            errors["url"] = "the server's URL is required, e.g. http://gpu-1:8000/v1"
        for name in OPENAI_ARG_FIELDS:
            value = values.get(name)
            if value and engine_args.get(name, value) != value:
                errors[name] = f"the engine arguments set {name} to {engine_args[name]!r} too"
            elif value:
                engine_args[name] = value
        return values.get("url") or None

    def spec(self) -> DeploymentSpec:
        """The deployment to create; FormErrors when a field is wrong."""
        errors: dict[str, str] = {}
        values = self.values
        name = values.get("name", "")
        if not NAME_PATTERN.fullmatch(name):
            errors["name"] = (
                f"'{name}' is not a valid name; use 1-63 lowercase letters, digits or dashes, "
                "starting and ending with a letter or digit (e.g. smollm2-chat)"
                if name
                else "a name is required, e.g. smollm2-chat"
            )
        replicas = parse_replicas(values.get("replicas", ""), errors)
        engine_args = parse_engine_args(values.get("engine_args", ""), errors)
        url = self._openai_target(values.get("engine", ""), engine_args, errors)
        model = values.get("model", "")
        spec: DeploymentSpec | None = None
        if not errors:
            try:
                spec = DeploymentSpec(
                    name=values["name"],
                    model=model or BUNDLED_MODEL,
                    engine=values.get("engine", ""),
                    role=parse_role(values.get("role", "")),
                    replicas=replicas,
                    engine_args=engine_args,
                    served_model_name=values.get("served_model_name") or name,
                    engine_file=url,
                )
            except ValueError as exc:
                errors[_field_of(str(exc))] = _plain(str(exc))
        if errors or spec is None:
            raise FormErrors(errors)
        return spec


def parse_replicas(text: str, errors: dict[str, str], key: str = "replicas") -> int:
    try:
        replicas = int(text)
    except ValueError:
        errors[key] = f"'{text}' is not a whole number; enter 0 to {MAX_REPLICAS}"
        return 0
    if not 0 <= replicas <= MAX_REPLICAS:
        errors[key] = f"{replicas} is out of range; enter 0 to {MAX_REPLICAS}"
    return replicas


def parse_engine_args(text: str, errors: dict[str, str]) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        errors["engine_args"] = (
            f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            'write an object such as {"max_num_seqs": 8}'
        )
        return {}
    if not isinstance(value, dict):
        errors["engine_args"] = (
            f'expected a JSON object such as {{"max_num_seqs": 8}}, got {type(value).__name__}'
        )
        return {}
    return value


def _field_of(message: str) -> str:
    """The form field a ``DeploymentSpec`` message is about: it quotes its field first."""
    for name in (*DEPLOYMENT_FIELDS, "engine_args"):
        if f"'{name}'" in message.split(" has value")[0]:
            return name
    return "name"


def _plain(message: str) -> str:
    """``Deployment 'name' has value 'X'; expected Y`` → ``'X' is not valid: expected Y``."""
    head, sep, expected = message.partition("; expected ")
    if not sep or " has value " not in head:
        return message
    value = head.split(" has value ", 1)[1]
    return f"{value} is not valid; expected {expected}"
