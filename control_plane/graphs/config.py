"""A graph's YAML: merging ``Common`` into components, validating, and the plan it makes.

    Common:
      engine: echo
      kv-cache-gib: 0.5
    Frontend:
      served_model_name: smollm2
      port: 8000
    Processor:
      router: round-robin
    Worker:
      ServiceArgs: {workers: 2, resources: {gpu: 1}}
      common-configs: [engine, kv-cache-gib]

A component's section holds its own settings; ``common-configs`` copies the named keys
from ``Common`` (its own keys win). ``ServiceArgs`` overrides ``@service``'s ``workers``
and ``resources``. Dashes and underscores in keys are the same. Every mistake names the
file, component, key and value.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dynask.control_plane.cluster.plan import engine_spec, served_name
from dynask.control_plane.graphs.components import (
    DeploymentRef,
    Frontend,
    Processor,
    Worker,
    overrides_process,
)
from dynask.control_plane.graphs.sdk import Graph, check_resources, dependencies, service_spec
from dynask.control_plane.routing.kv_router import ROUTING_MODES
from dynask.control_plane.state.deployment import BUNDLED_MODEL, DeploymentSpec, parse_role

COMMON = "Common"
_FRONTEND_KEYS = ("served_model_name", "port")
_ROUTER_KEYS = ("router", "kv_overlap_weight", "router_temperature")
_INFO_KEYS = ("model", "block_size", "max_model_len")  # shared Dynamo keys a processor ignores
_WORKER_KEYS = ("model", "engine", "role")


@dataclass(frozen=True)
class GraphPlan:
    """What ``dynask serve MODULE:Component -f CONFIG.yaml`` starts."""

    name: str
    target: str
    description: dict[str, Any]
    config: dict[str, dict[str, Any]]
    deployments: list[DeploymentSpec]
    routing: dict[str, Any] = field(default_factory=dict)  # RoutingOptions fields
    frontend: dict[str, Any] = field(default_factory=dict)  # served_model_name, port, host
    processor: type | None = None  # a custom Processor to run as an actor
    processor_config: dict[str, Any] = field(default_factory=dict)
    processor_handles: dict[str, DeploymentRef] = field(default_factory=dict)


def read_graph_config(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"graph config '{path}' does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"graph config '{path}' is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"graph config '{path}' must be a mapping of component names")
    return data


def _key(name: Any) -> str:
    return str(name).replace("-", "_")


def merge_sections(graph: Graph, data: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Each component's settings: its section with the ``common-configs`` keys filled in."""
    names = graph.names()
    for key in data:
        if key != COMMON and key not in names:
            raise ValueError(
                f"{where}: section '{key}' names no component of the graph of "
                f"{graph.root.__name__}; its components: {', '.join(names)} (and {COMMON})"
            )
    common = data.get(COMMON) or {}
    if not isinstance(common, dict):
        raise ValueError(f"{where}: '{COMMON}' must be a mapping, not {common!r}")
    merged: dict[str, dict[str, Any]] = {}
    for name in names:
        section = data.get(name) or {}
        if not isinstance(section, dict):
            raise ValueError(f"{where}: '{name}' must be a mapping, not {section!r}")
        shared = section.get("common-configs", section.get("common_configs", []))
        if not isinstance(shared, list) or not all(isinstance(k, str) for k in shared):
            raise ValueError(
                f"{where}: {name} 'common-configs' has value {shared!r}; expected a list of keys"
            )
        own = {_key(k): v for k, v in section.items() if _key(k) != "common_configs"}
        settings: dict[str, Any] = {}
        for key in shared:
            if key not in common:
                raise ValueError(
                    f"{where}: {name} 'common-configs' names '{key}', which {COMMON} lacks; "
                    f"{COMMON} has: {', '.join(map(str, common)) or '(nothing)'}"
                )
            settings[_key(key)] = common[key]
        merged[name] = {**settings, **own}
    return merged


def plan_graph(graph: Graph, target: str, data: dict[str, Any], where: str) -> GraphPlan:
    """Validates the merged settings of every component and turns them into a plan."""
    merged = merge_sections(graph, data, where)
    name = _slug(target.split(":")[0].rsplit("/", 1)[-1].removesuffix(".py").split(".")[-1])
    frontends = [c for c in graph.components if issubclass(c, Frontend)]
    if len(frontends) != 1:
        raise ValueError(
            f"{where}: the graph of {graph.root.__name__} needs exactly one Frontend, "
            f"found {len(frontends)}"
        )
    workers = [c for c in graph.components if issubclass(c, Worker)]
    if not workers:
        raise ValueError(f"{where}: the graph of {graph.root.__name__} has no Worker; link one")
    customs = [c for c in graph.components if overrides_process(c)]
    if len(customs) > 1:
        raise ValueError(
            f"{where}: the graph has {len(customs)} custom processors; one is supported"
        )
    service_args = {
        c.__name__: _service_args(c, merged[c.__name__], where) for c in graph.components
    }
    frontend = _known(
        merged[frontends[0].__name__], _FRONTEND_KEYS, f"{where}: {frontends[0].__name__}"
    )
    routing: dict[str, Any] = {}
    processor_config: dict[str, Any] = {}
    for cls in graph.components:
        if not issubclass(cls, Processor):
            continue
        settings = merged[cls.__name__]
        if not overrides_process(cls):
            _known(settings, (*_ROUTER_KEYS, *_INFO_KEYS), f"{where}: {cls.__name__}")
        routing.update(_routing(settings, f"{where}: {cls.__name__}"))
        processor_config = {k: v for k, v in settings.items() if k not in _ROUTER_KEYS}
    deployments = [
        _deployment(c, merged[c.__name__], service_args[c.__name__], name, where) for c in workers
    ]
    served = frontend.get("served_model_name") or served_name(deployments[0].model_path)
    deployments = [dataclasses.replace(d, served_model_name=str(served)) for d in deployments]
    description = graph.describe()
    for component, cls in zip(description["components"], graph.components, strict=True):
        component.update(service_args[cls.__name__])
        if issubclass(cls, Worker):
            component["deployment"] = f"{name}-{_slug(cls.__name__)}"
    handles: dict[str, DeploymentRef] = {}
    if customs:
        for attr, dep in dependencies(customs[0]).items():
            for cls, plan in zip(workers, deployments, strict=True):
                if issubclass(cls, dep.target):
                    handles[attr] = DeploymentRef(plan.name, plan.model_name)
                    break
    return GraphPlan(
        name=name,
        target=target,
        description=description,
        config=merged,
        deployments=deployments,
        routing=routing,
        frontend=frontend,
        processor=customs[0] if customs else None,
        processor_config=processor_config,
        processor_handles=handles,
    )


def _slug(text: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", text).replace("_", "-").lower()


def _known(settings: dict[str, Any], keys: tuple[str, ...], where: str) -> dict[str, Any]:
    for key, value in settings.items():
        if key not in (*keys, "ServiceArgs"):
            raise ValueError(
                f"{where} has unknown key '{key}' (value {value!r}); known: {', '.join(keys)}"
            )
    return {k: v for k, v in settings.items() if k != "ServiceArgs"}


def _service_args(cls: type, settings: dict[str, Any], where: str) -> dict[str, Any]:
    spec = service_spec(cls)
    args = settings.get("ServiceArgs") or {}
    here = f"{where}: {cls.__name__} ServiceArgs"
    if not isinstance(args, dict):
        raise ValueError(f"{here} must be a mapping with 'workers' and/or 'resources'")
    for key in args:
        if key not in ("workers", "resources"):
            raise ValueError(f"{here} has unknown key '{key}'; known: workers, resources")
    workers = args.get("workers", spec.workers)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ValueError(f"{here} 'workers' has value {workers!r}; expected an integer >= 0")
    if not issubclass(cls, Worker) and workers != 1:
        raise ValueError(f"{here} 'workers' has value {workers!r}; {cls.__name__} runs once (1)")
    resources = args.get("resources", spec.resources)
    check_resources(resources, here)
    return {"workers": workers, "resources": dict(resources)}


def _routing(settings: dict[str, Any], where: str) -> dict[str, Any]:
    routing: dict[str, Any] = {}
    if "router" in settings:
        mode = settings["router"]
        if mode not in ROUTING_MODES:
            raise ValueError(
                f"{where} 'router' has value {mode!r}; expected one of {', '.join(ROUTING_MODES)}"
            )
        routing["mode"] = mode
    for key, field_name in (
        ("kv_overlap_weight", "overlap_weight"),
        ("router_temperature", "temperature"),
    ):
        if key in settings:
            value = settings[key]
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{where} '{key}' has value {value!r}; expected a number >= 0")
            routing[field_name] = float(value)
    return routing


def _deployment(
    cls: type, settings: dict[str, Any], service_args: dict[str, Any], graph: str, where: str
) -> DeploymentSpec:
    from dynask.actors.runtime.engine_factory import parse_engine

    here = f"{where}: {cls.__name__}"
    role = parse_role(settings.get("role", getattr(cls, "role", "aggregated")), here)
    engine_args = {k: v for k, v in settings.items() if k not in (*_WORKER_KEYS, "ServiceArgs")}
    model = settings.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{here} 'model' has value {model!r}; expected a path or hub id")
    name = f"{graph}-{_slug(cls.__name__)}"
    try:
        kind, python_file = parse_engine(str(settings.get("engine", "torch")))
        deployment = DeploymentSpec(
            name=name,
            model=model or BUNDLED_MODEL,
            engine=kind,
            role=role,
            replicas=service_args["workers"],
            engine_args=engine_args,
            served_model_name=name,
            engine_file=python_file,
        )
        engine_spec(deployment)  # the engine factory's own checks, now
    except ValueError as exc:
        raise ValueError(f"{here}: {exc}") from exc
    return deployment
