"""What ``dynask run`` and ``dynask serve`` do once their arguments are parsed."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dynask.control_plane.cli.disagg_flags import disagg_options, embedded_deployments
from dynask.control_plane.cli.engine_flags import engine_args
from dynask.control_plane.cluster.deploy_file import read_deploy_file
from dynask.control_plane.cluster.gpu_placement import WorkerPlacement, placements_for_run
from dynask.control_plane.cluster.plan import engine_spec, served_name
from dynask.control_plane.state.deployment import BUNDLED_MODEL, DeploymentSpec

if TYPE_CHECKING:
    from dynask.control_plane.cluster.pools import PoolPlacement
    from dynask.control_plane.server import Extension, ServerOptions

IN_MODES = ("http", "text", "batch:FILE.jsonl", "dyn://POOL")
ENGINE_FORMS = ("torch", "vllm", "echo", "mocker", "python:FILE.py", "openai:URL", "dyn://POOL")
GPU_ENGINES = ("torch", "vllm")  # the engines that take a GPU and a memory fraction


def _check_input(mode: str) -> None:
    if mode in ("http", "text") or (mode.startswith("batch:") and mode != "batch:"):
        return
    if mode.startswith("dyn://"):
        return
    if mode == "batch:":
        raise ValueError("in=batch: needs a file, e.g. in=batch:prompts.jsonl")
    raise ValueError(
        f"in={mode} is not an input mode; use one of: " + ", ".join(f"in={m}" for m in IN_MODES)
    )


def run_command(args: argparse.Namespace, extensions: Sequence[Extension] = ()) -> int:
    from dynask.actors.runtime.engine_factory import parse_engine, prepare_model

    _check_input(args.input)
    if args.input.startswith("dyn://"):
        from dynask.control_plane.cli.pool_node import pool_node_command

        return pool_node_command(args)
    if args.engine.startswith("dyn://"):
        return _serve_pool(args, extensions)
    if args.scheduler is not None:
        raise ValueError(
            "dynask run --scheduler is for pools (in=dyn://POOL on a node, out=dyn://POOL on a "
            "front end); for a control plane of a cluster use dynask serve --scheduler"
        )
    kind, python_file = parse_engine(args.engine)
    if args.model and args.model_path and args.model != args.model_path:
        raise ValueError(f"two models given ({args.model!r} and --model-path {args.model_path!r})")
    model = args.model or args.model_path
    prepare_model(model)  # once, here: before any worker starts
    aggregated = DeploymentSpec(
        name="default",
        model=model or BUNDLED_MODEL,
        engine=kind,
        replicas=args.workers,
        engine_args=engine_args(args),
        served_model_name=args.model_name or served_name(model),
        engine_file=python_file,
    )
    engine_spec(aggregated)  # the engine factory's own checks, before any worker starts
    deployments, n_workers = embedded_deployments(args, aggregated)
    placements = _gpu_placements(args, deployments, n_workers)
    if placements:
        deployments = [_with_fraction(d, placements[0].fraction) for d in deployments]
    if args.input == "http":
        return _serve_http(
            args,
            deployments,
            scheduler=None,
            n_workers=n_workers,
            extensions=extensions,
            placements=placements,
        )
    return _run_local(args, deployments, n_workers, model, placements)


def _gpu_placements(
    args: argparse.Namespace, deployments: list[DeploymentSpec], n_workers: int
) -> list[WorkerPlacement]:
    """One GPU per worker (or several engines per GPU), for engines that run on GPUs."""
    from dynask.actors.runtime.gpu_discovery import discover_gpus

    if any(d.engine not in GPU_ENGINES for d in deployments):
        return []
    return placements_for_run(
        n_workers, args.device, discover_gpus(), args.engines_per_gpu, args.gpu_memory_utilization
    )


def _with_fraction(deployment: DeploymentSpec, fraction: float) -> DeploymentSpec:
    engine_args = {"gpu_memory_utilization": fraction, **deployment.engine_args}
    return dataclasses.replace(deployment, engine_args=engine_args)


def _serve_pool(args: argparse.Namespace, extensions: Sequence[Extension]) -> int:
    """``out=dyn://POOL``: serve (``in=http``) or chat with (``in=text``) the engines of a
    pool that nodes joined (``cluster.pools``)."""
    import asyncio

    from dynask.control_plane.cluster import pools

    pool = pools.pool_name(args.engine)
    if args.scheduler is None:
        raise ValueError(
            f"out=dyn://{pool} serves a cluster's pool: add --scheduler tcp://HOST:8786"
        )
    for given, what in (
        (args.model or args.model_path, "MODEL"),
        (args.model_name, "--model-name"),
    ):
        if given:
            raise ValueError(
                f"out=dyn://{pool} serves the pool's model: give {what} to its nodes "
                f"(dynask run in=dyn://{pool} out=ENGINE MODEL --scheduler ...)"
            )
    if args.input not in ("http", "text"):
        raise ValueError(f"out=dyn://{pool} works with in=http or in=text, not in={args.input}")
    spec = asyncio.run(_pool_spec(args.scheduler, pool))
    placement = pools.PoolPlacement([pool])
    if args.input == "text":
        return _run_local(
            args, [spec], 0, spec.model, scheduler=args.scheduler, placement=placement
        )

    def follow_pool(control_plane: Any) -> list[Any]:
        control_plane.runtime.use_placement(placement)
        return []

    return _serve_http(args, [spec], args.scheduler, 0, [follow_pool, *extensions])


async def _pool_spec(scheduler: str, pool: str) -> DeploymentSpec:
    from distributed import Client

    from dynask.control_plane.cluster import pools

    print(f"dynask: waiting for pool '{pool}' on {scheduler} ...", file=sys.stderr, flush=True)
    async with Client(scheduler, asynchronous=True) as client:  # type: ignore[no-untyped-call]
        return await pools.wait_for_pool(client, pool)


def _run_local(
    args: argparse.Namespace,
    deployments: list[DeploymentSpec],
    n_workers: int,
    model: str | None,
    placements: Sequence[WorkerPlacement] = (),
    scheduler: str | None = None,
    placement: PoolPlacement | None = None,
) -> int:
    """``in=text`` / ``in=batch``: the serving pipeline over an embedded cluster, no HTTP."""
    import asyncio

    from dynask.control_plane.cli.batch_input import read_batch, run_batch
    from dynask.control_plane.cli.local_pipeline import local_pipeline
    from dynask.control_plane.cli.text_chat import run_text_chat

    batch_file = args.input.removeprefix("batch:") if args.input.startswith("batch:") else None
    items = read_batch(batch_file) if batch_file is not None else []  # bad lines fail first
    options = _server_options(args, scheduler=scheduler, n_workers=n_workers)
    _quiet_cluster_logs(args.log_level)

    async def session() -> int:
        print(f"loading {model or 'the bundled SmolLM2-135M-Instruct'} ...", file=sys.stderr)
        async with local_pipeline(
            deployments,
            n_workers,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            routing=options.routing,
            disagg=options.disagg,
            reliability=options.reliability,
            placements=placements,
            scheduler_address=scheduler,
            placement=placement,
        ) as pipeline:
            if batch_file is not None:
                return await run_batch(pipeline, batch_file, items)
            return await run_text_chat(pipeline)

    return asyncio.run(session())


def _quiet_cluster_logs(log_level: str) -> None:
    """The terminal is the chat (or the progress bar): the embedded cluster's own
    messages (an event loop slow under load, say) show only when they are errors, unless
    ``--log-level`` asks for more. Worker processes read the level from the environment
    when they start."""
    import logging
    import os

    asked = logging.getLevelName(log_level.upper())
    level = asked if isinstance(asked, int) and asked < logging.WARNING else logging.ERROR
    logging.getLogger("distributed").setLevel(level)
    os.environ["DASK_LOGGING__DISTRIBUTED"] = logging.getLevelName(level).lower()


def serve_command(args: argparse.Namespace, extensions: Sequence[Extension] = ()) -> int:
    if getattr(args, "graph", None):
        from dynask.control_plane.cli.graph_command import graph_extension, graph_plan_for

        plan = graph_plan_for(args)
        return _serve_http(
            args, plan.deployments, args.scheduler, 0, [graph_extension(plan), *extensions]
        )
    if args.port is None:
        args.port = 8000
    deployments = read_deploy_file(args.deploy_file) if args.deploy_file else []
    return _serve_http(
        args, deployments, scheduler=args.scheduler, n_workers=0, extensions=extensions
    )


def _serve_http(
    args: argparse.Namespace,
    deployments: list[DeploymentSpec],
    scheduler: str | None,
    n_workers: int,
    extensions: Sequence[Extension] = (),
    placements: Sequence[WorkerPlacement] = (),
) -> int:
    from dynask.control_plane.server import ControlPlane

    options = _server_options(args, scheduler, n_workers, placements)
    return ControlPlane(deployments, options, extensions).serve()


def _server_options(
    args: argparse.Namespace,
    scheduler: str | None,
    n_workers: int,
    placements: Sequence[WorkerPlacement] = (),
) -> ServerOptions:
    """The ``ServerOptions`` the flags ask for."""
    from dynask.control_plane.cli.chat_flags import chat_options
    from dynask.control_plane.cli.planner_flags import planner_config
    from dynask.control_plane.cli.reliability_flags import reliability_options, tenant_defaults
    from dynask.control_plane.cluster.ssh_settings import SSHOptions
    from dynask.control_plane.flags import options_from
    from dynask.control_plane.observability.tracing import TracingOptions
    from dynask.control_plane.routing.routing_options import RoutingOptions
    from dynask.control_plane.server import ServerOptions

    return options_from(
        args,
        ServerOptions,
        routing=options_from(args, RoutingOptions),
        scheduler_address=scheduler,
        n_workers=n_workers,
        gpu_placements=tuple(placements),
        disagg=disagg_options(args),
        reliability=reliability_options(args),
        tenant_defaults=tenant_defaults(args),
        planner=planner_config(args),
        chat=chat_options(args),
        tracing=options_from(args, TracingOptions),
        ssh=options_from(args, SSHOptions),
    )
