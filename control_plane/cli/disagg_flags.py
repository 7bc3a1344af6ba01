"""Command-line flags for disaggregated prefill and decode.

``dynask run --prefill-workers P --decode-workers D`` starts P + D local workers with a
``prefill`` deployment of P replicas and a ``decode`` deployment of D; ``dynask serve``
takes the roles from ``deploy.yaml``. Both take the transport and the thresholds.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.flags import add_flags, flag, non_negative_int, options_from
from dynask.control_plane.state.deployment import DeploymentSpec, Role


@dataclass(frozen=True)
class EmbeddedWorkers:
    """``dynask run``'s prefill and decode worker counts (0 and 0: aggregated)."""

    prefill_workers: int = flag(
        "--prefill-workers",
        0,
        "workers whose engines only prefill (with --decode-workers; replaces --workers)",
        type=non_negative_int,
    )
    decode_workers: int = flag(
        "--decode-workers", 0, "workers whose engines decode", type=non_negative_int
    )


def add_disagg_arguments(cmd: argparse.ArgumentParser, embedded: bool) -> None:
    group = cmd.add_argument_group(
        "disaggregated prefill/decode" + (" (deploy.yaml gives the roles)" if not embedded else "")
    )
    if embedded:
        add_flags(group, EmbeddedWorkers)
    add_flags(group, DisaggOptions)


def disagg_options(args: argparse.Namespace) -> DisaggOptions:
    return options_from(args, DisaggOptions)


def embedded_deployments(
    args: argparse.Namespace, aggregated: DeploymentSpec
) -> tuple[list[DeploymentSpec], int]:
    """The deployments and worker count of ``dynask run``: ``aggregated`` on
    ``--workers``, or a prefill and a decode deployment when their flags are given."""
    workers = options_from(args, EmbeddedWorkers)
    prefill, decode = workers.prefill_workers, workers.decode_workers
    if not prefill and not decode:
        return [aggregated], args.workers
    if not prefill or not decode:
        raise ValueError(
            f"--prefill-workers is {prefill} and --decode-workers is {decode}; disaggregated "
            "serving needs at least one of each (or neither, for --workers)"
        )
    if args.workers not in (1, prefill + decode):
        raise ValueError(
            f"--workers {args.workers} contradicts --prefill-workers {prefill} + "
            f"--decode-workers {decode}; leave --workers out"
        )
    plans = [
        dataclasses.replace(
            aggregated,
            name=f"{aggregated.name}-{role}",
            served_model_name=aggregated.model_name,
            replicas=replicas,
            role=role,
        )
        for role, replicas in ((Role.PREFILL, prefill), (Role.DECODE, decode))
    ]
    return plans, prefill + decode
