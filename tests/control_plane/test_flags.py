"""Options declared once (``control_plane.flags``): the argparse groups and the options
objects both come from the dataclass fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from dynask.control_plane.cli.main import _parser
from dynask.control_plane.cluster.ssh_settings import SSHOptions
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.flags import add_flags, flags_of, options_from, origins
from dynask.control_plane.planner.decision import PlannerConfig
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.server import ServerOptions

OPTIONS = [
    RoutingOptions,
    ReliabilityOptions,
    DisaggOptions,
    PlannerConfig,
    ServerOptions,
    SSHOptions,
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.__name__)
def test_no_flags_give_the_dataclass_defaults(options: type) -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, options)
    assert options_from(parser.parse_args([]), options) == options()


@pytest.mark.parametrize("command", ["run", "serve"])
def test_every_declared_flag_is_on_the_command(command: str) -> None:
    actions = {a.dest: a for a in _parser()._subparsers._group_actions[0].choices[command]._actions}  # type: ignore[union-attr]
    for options in OPTIONS:
        for field, declared in flags_of(options):
            assert declared.dest in actions, declared.name
            if field.name not in ("require_api_key", "port"):  # per-command defaults
                assert actions[declared.dest].default == field.default, declared.name


def test_parsed_flags_make_the_options() -> None:
    argv = ["run", "--migration-limit", "5", "--max-in-flight", "none", "--router-mode", "random"]
    args = _parser().parse_args(argv)
    assert options_from(args, ReliabilityOptions) == dataclasses.replace(
        ReliabilityOptions(), migration_limit=5, max_in_flight=None
    )
    assert options_from(args, RoutingOptions) == RoutingOptions(mode="random")
    assert options_from(args, ServerOptions, n_workers=3) == ServerOptions(n_workers=3)


def test_cors_origins_are_parsed_and_checked() -> None:
    assert origins("https://a.example.com, http://localhost:3000/") == (
        "https://a.example.com",
        "http://localhost:3000",
    )
    assert origins("*") == ("*",)
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        origins("a.example.com")
    assert str(raised.value) == (
        "has value 'a.example.com'; 'a.example.com' is not an origin such as "
        "'https://app.example.com' or 'http://localhost:3000' (or '*': any)"
    )
