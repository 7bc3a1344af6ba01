"""The command-line flags of migration, failure detection and load shedding (declared on
``ReliabilityOptions``' fields) and of keyless tenants (``TenantDefaults``' fields)."""

from __future__ import annotations

import argparse

from dynask.control_plane.flags import add_flags, options_from
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.serving.tenants import TenantDefaults
from dynask.control_plane.state.api_keys import TenantLimits


def add_reliability_args(cmd: argparse.ArgumentParser) -> None:
    add_flags(cmd.add_argument_group("reliability (lost workers, overload)"), ReliabilityOptions)
    tenants = cmd.add_argument_group(
        "tenants without an API key of their own (by the request's 'user' field, else "
        "one 'anonymous' tenant; keys carry their own limits: dynask keys limits)"
    )
    add_flags(tenants, TenantDefaults)


def tenant_defaults(args: argparse.Namespace) -> TenantLimits:
    """The limits of tenants without a key (``ValueError``, a CLI error, if bad)."""
    return options_from(args, TenantDefaults).limits()


def reliability_options(args: argparse.Namespace) -> ReliabilityOptions:
    """The options from parsed flags; ``ValueError`` (a CLI error) if they contradict."""
    return options_from(args, ReliabilityOptions)
