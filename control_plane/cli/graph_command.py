"""``dynask serve MODULE:Component -f CONFIG.yaml``: serving an inference graph.

The graph's Workers become deployments (the reconciler keeps them running); the
Frontend's ``port`` and ``served_model_name`` and the Processor's router settings take
the place of the matching flags (``--port`` given on the command line wins); a custom
Processor runs as a Dask actor that every request passes through.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dynask.control_plane.graphs.config import GraphPlan
from dynask.control_plane.graphs.runtime import ProcessorHook, load_graph_plan
from dynask.control_plane.graphs.store import store_graph

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from dynask.control_plane.server import ControlPlane, Extension

DEFAULT_PORT = 8000


def graph_plan_for(args: argparse.Namespace) -> GraphPlan:
    """Loads and validates the graph; sets the flags its Frontend and Processor give."""
    if not args.deploy_file:
        raise ValueError(
            f"dynask serve {args.graph} needs the graph's settings: add -f CONFIG.yaml "
            "(see deploy/graphs/agg.yaml)"
        )
    plan = load_graph_plan(args.graph, args.deploy_file)
    if args.port is None:
        args.port = int(plan.frontend.get("port", DEFAULT_PORT))
    args.router_mode = plan.routing.get("mode", args.router_mode)
    args.kv_overlap_weight = plan.routing.get("overlap_weight", args.kv_overlap_weight)
    args.router_temperature = plan.routing.get("temperature", args.router_temperature)
    return plan


def graph_extension(plan: GraphPlan) -> Extension:
    """Stores the graph and wires its custom processor into the request path."""

    def extend(control_plane: ControlPlane) -> list[BaseRoute]:
        store_graph(control_plane.repo.engine, plan)
        if plan.processor is not None:
            runtime = control_plane.runtime
            control_plane.service.request_hook = ProcessorHook(
                plan.processor,
                plan.processor_config,
                lambda: runtime.client,
                plan.processor_handles,
            )
        return []

    return extend
