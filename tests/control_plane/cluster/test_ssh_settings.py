"""Where the SSH settings of remote workers come from: ``--ssh-known-hosts``/``--ssh-key``
on ``dynask run`` and ``serve``, else ``$DYNASK_SSH_KNOWN_HOSTS``/``$DYNASK_SSH_KEY``,
else the SSH defaults; the options reach the control plane."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynask.control_plane.cli.commands import _server_options
from dynask.control_plane.cli.main import parse
from dynask.control_plane.cluster.ssh_settings import SSHOptions, SSHSettings

HOME = Path("~").expanduser()
ENV = {"DYNASK_SSH_KNOWN_HOSTS": "/etc/dynask/known_hosts", "DYNASK_SSH_KEY": "~/.ssh/dynask"}


@pytest.mark.parametrize("command", [["run"], ["serve", "--scheduler", "tcp://10.0.0.1:8786"]])
def test_the_flags_are_parsed_into_the_server_options(command: list[str]) -> None:
    argv = [*command, "--ssh-known-hosts", "/srv/known_hosts", "--ssh-key", "/srv/id_ed25519"]
    args = parse(argv)
    options = _server_options(args, scheduler=None, n_workers=1)
    assert options.ssh == SSHOptions("/srv/known_hosts", "/srv/id_ed25519")
    assert _server_options(parse(command), None, 1).ssh == SSHOptions(None, None)


def test_flags_win_over_the_environment() -> None:
    settings = SSHOptions("/srv/known_hosts", "/srv/id_ed25519").settings(ENV)
    assert settings == SSHSettings(
        Path("/srv/known_hosts"), Path("/srv/id_ed25519"), "--ssh-known-hosts", "--ssh-key"
    )


def test_the_environment_is_the_default() -> None:
    settings = SSHOptions().settings(ENV)
    assert settings == SSHSettings(
        Path("/etc/dynask/known_hosts"),
        HOME / ".ssh" / "dynask",
        "$DYNASK_SSH_KNOWN_HOSTS",
        "$DYNASK_SSH_KEY",
    )


def test_without_either_the_ssh_defaults_are_used() -> None:
    for env in ({}, {"DYNASK_SSH_KNOWN_HOSTS": "", "DYNASK_SSH_KEY": ""}):  # empty is unset
        settings = SSHOptions().settings(env)
        assert settings == SSHSettings(HOME / ".ssh" / "known_hosts", None, "default", "default")
        assert settings.client_key_text == "~/.ssh/id_* and the SSH agent"


def test_an_empty_flag_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="SSHOptions 'ssh_key' has value ' '; expected a file"):
        SSHOptions(ssh_key=" ")


def test_no_flag_turns_host_key_checking_off() -> None:
    flags = {a for a in parse(["run"]).__dict__ if a.startswith("ssh")}
    assert flags == {"ssh_known_hosts", "ssh_key"}
