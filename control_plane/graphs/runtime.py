"""Running a graph: loading ``MODULE:Component``, and a custom Processor as a Dask actor.

``load_graph("deploy/graphs/agg.py:Frontend")`` imports the file (or a dotted module
from the current folder) and walks the graph from the named component. A custom
processor's class is pickled by value, so Dask workers need not have the user's file.

``ProcessorHook`` is what the control plane calls for each request before tokenizing
and routing it: one actor call to the processor's ``process``. It creates the actor on
the first request and again if its worker is lost; an error in ``process`` is the
client's 400 with the processor's message, never a crashed worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from dynask.control_plane.api.errors import APIError
from dynask.control_plane.graphs.components import (
    PROCESSED_KEYS,
    DeploymentRef,
    ProcessorActor,
)
from dynask.control_plane.graphs.config import GraphPlan, plan_graph, read_graph_config
from dynask.control_plane.graphs.sdk import Graph, build_graph, unlink_all
from dynask.control_plane.serving.request import GenerationRequest

PROCESS_TIMEOUT_S = 60.0


def load_graph(target: str) -> Graph:
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"graph target {target!r} is not MODULE:Component, e.g. graphs.agg:Frontend"
        )
    from dynask.control_plane.graphs import components as builtins

    # A graph module links the shared built-ins (Frontend.link(...)): start them clean.
    unlink_all(*(v for v in vars(builtins).values() if isinstance(v, type)))
    module = _import(module_name, target)
    root = getattr(module, attr, None)
    if not isinstance(root, type):
        raise ValueError(f"graph target {target!r}: {module_name} has no component class {attr!r}")
    return build_graph(root)


def _import(module_name: str, target: str) -> Any:
    import cloudpickle

    path = Path(module_name)
    if module_name.endswith(".py") or path.is_file():
        if not path.is_file():
            raise ValueError(f"graph target {target!r}: the file {module_name} does not exist")
        name = f"dynask_graph_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
            module = importlib.reload(module)  # its links run again on clean built-ins
        except ImportError as exc:
            raise ValueError(
                f"graph target {target!r}: cannot import {module_name}: {exc}"
            ) from exc
    if not module.__name__.startswith("dynask."):
        cloudpickle.register_pickle_by_value(module)  # workers need not have the file
    return module


def load_graph_plan(target: str, config_path: str) -> GraphPlan:
    graph = load_graph(target)
    return plan_graph(graph, target, read_graph_config(config_path), config_path)


class ProcessorHook:
    """Passes each request through the custom processor actor."""

    def __init__(
        self,
        cls: type,
        config: dict[str, Any],
        client_getter: Any,
        handles: dict[str, DeploymentRef] | None = None,
    ) -> None:
        self.cls = cls
        self.config = config
        self.handles = dict(handles or {})
        self._client = client_getter  # () -> the runtime's dask Client (None until started)
        self._actor: Any = None
        self._lock = asyncio.Lock()

    async def _proxy(self) -> Any:
        async with self._lock:
            if self._actor is None:
                client = self._client()
                if client is None:
                    raise APIError("the cluster is starting; retry", status=503, code="starting")
                import cloudpickle

                pickled = cloudpickle.dumps(self.cls)
                future = client.submit(
                    ProcessorActor, pickled, self.config, self.handles, actor=True, pure=False
                )
                try:
                    self._actor = await asyncio.wait_for(future, PROCESS_TIMEOUT_S)
                except Exception as exc:  # no worker, or the class fails to build
                    raise APIError(
                        f"the processor {self.cls.__name__} could not start: {exc}; retry",
                        status=503,
                        code="processor_unavailable",
                    ) from exc
            return self._actor

    async def __call__(self, request: GenerationRequest) -> GenerationRequest:
        proxy = await self._proxy()
        body = {"model": request.model, "messages": request.messages, "prompt": request.prompt}
        try:
            result = await asyncio.wait_for(proxy.process(body), PROCESS_TIMEOUT_S)
        except (ValueError, TypeError, KeyError) as exc:
            raise APIError(
                f"the processor {self.cls.__name__} rejected the request: {exc}"
            ) from exc
        except Exception as exc:  # the actor's worker is gone, say: make a new one next time
            self._actor = None
            raise APIError(
                f"the processor {self.cls.__name__} failed: {exc}; retry",
                status=503,
                code="processor_unavailable",
            ) from exc
        return _changed(request, result, self.cls.__name__)


def _changed(request: GenerationRequest, result: Any, who: str) -> GenerationRequest:
    if not isinstance(result, dict):
        raise APIError(f"the processor {who} returned {type(result).__name__}, not a dict")
    changes = {k: result[k] for k in PROCESSED_KEYS if k in result}
    if request.messages is not None and not isinstance(changes.get("messages", []), list):
        raise APIError(f"the processor {who} returned 'messages' that are not a list")
    return dataclasses.replace(request, **changes)
