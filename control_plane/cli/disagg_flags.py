"""Command-line flags for disaggregated prefill and decode.

``dynask run --prefill-workers P --decode-workers D`` starts P + D local workers with a
``prefill`` deployment of P replicas and a ``decode`` deployment of D; ``dynask serve``
takes the roles from ``deploy.yaml``. Both take the transport and the thresholds.
"""

from __future__ import annotations

import argparse

from dynask.control_plane.cli.arg_types import non_negative_int
from dynask.control_plane.cluster.plan import DeploymentPlan
from dynask.control_plane.disagg.orchestrator import DECODE_ROLE, PREFILL_ROLE, DisaggOptions
from dynask.kv.transfer import TRANSPORTS

_DEFAULTS = DisaggOptions()


def add_disagg_arguments(cmd: argparse.ArgumentParser, embedded: bool) -> None:
    group = cmd.add_argument_group(
        "disaggregated prefill/decode" + (" (deploy.yaml gives the roles)" if not embedded else "")
    )
    if embedded:
        group.add_argument(
            "--prefill-workers",
            type=non_negative_int,
            default=0,
            help="workers whose engines only prefill (with --decode-workers; replaces --workers)",
        )
        group.add_argument(
            "--decode-workers",
            type=non_negative_int,
            default=0,
            help="workers whose engines decode",
        )
    group.add_argument(
        "--kv-transport",
        default=_DEFAULTS.transport,
        choices=TRANSPORTS,
        help="how KV blocks move between actors (ucxx needs the ucxx-cu12/cu13 wheel)",
    )
    group.add_argument(
        "--remote-prefill-min-tokens",
        type=non_negative_int,
        default=_DEFAULTS.min_remote_prefill_tokens,
        help="prompts with fewer tokens uncached on the decode engine prefill there "
        f"(default {_DEFAULTS.min_remote_prefill_tokens})",
    )
    group.add_argument(
        "--max-prefills-per-worker",
        type=non_negative_int,
        default=_DEFAULTS.max_prefills_per_actor,
        help="remote prefills in flight per prefill engine; when all are at it, the decode "
        f"engine prefills (default {_DEFAULTS.max_prefills_per_actor})",
    )
    group.add_argument(
        "--kv-transfer-timeout",
        type=float,
        default=_DEFAULTS.transfer_timeout_s,
        help="seconds a decode engine waits for remote KV before prefilling itself "
        f"(default {_DEFAULTS.transfer_timeout_s:g})",
    )


def disagg_options(args: argparse.Namespace) -> DisaggOptions:
    return DisaggOptions(
        transport=args.kv_transport,
        min_remote_prefill_tokens=args.remote_prefill_min_tokens,
        max_prefills_per_actor=args.max_prefills_per_worker,
        transfer_timeout_s=args.kv_transfer_timeout,
    )


def embedded_deployments(
    args: argparse.Namespace, aggregated: DeploymentPlan
) -> tuple[list[DeploymentPlan], int]:
    """The deployments and worker count of ``dynask run``: ``aggregated`` on
    ``--workers``, or a prefill and a decode deployment when their flags are given."""
    prefill, decode = args.prefill_workers, args.decode_workers
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
        DeploymentPlan(
            f"{aggregated.name}-{role}",
            aggregated.served_model_name,
            aggregated.spec,
            replicas,
            role,
        )
        for role, replicas in ((PREFILL_ROLE, prefill), (DECODE_ROLE, decode))
    ]
    return plans, prefill + decode
