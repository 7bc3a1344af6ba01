"""How the control plane logs in to other hosts: where host keys are checked, which key.

``SSHOptions`` are the ``dynask run/serve`` flags ``--ssh-known-hosts`` and ``--ssh-key``;
``settings()`` resolves them into ``SSHSettings``: a flag, else the environment variable
(``$DYNASK_SSH_KNOWN_HOSTS``, ``$DYNASK_SSH_KEY``), else the SSH defaults. Each setting
remembers where it came from, for the remote workers page.

Host keys are always verified: there is a file to check against, never a switch that
turns the check off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dynask.control_plane.flags import flag

KNOWN_HOSTS_VARIABLE = "DYNASK_SSH_KNOWN_HOSTS"
CLIENT_KEY_VARIABLE = "DYNASK_SSH_KEY"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_CLIENT_KEYS = "~/.ssh/id_* and the SSH agent"


@dataclass(frozen=True)
class SSHSettings:
    """Where host keys are checked and which client key logs in."""

    known_hosts: Path
    client_key: Path | None = None  # None: ~/.ssh/id_* and the agent
    known_hosts_from: str = "given"  # "--ssh-known-hosts", "$DYNASK_SSH_KNOWN_HOSTS", "default"
    client_key_from: str = "given"

    @property
    def client_key_text(self) -> str:
        return str(self.client_key) if self.client_key is not None else DEFAULT_CLIENT_KEYS


@dataclass(frozen=True)
class SSHOptions:
    """The SSH flags of ``dynask run/serve`` (workers on other hosts, admin UI)."""

    ssh_known_hosts: str | None = flag(
        "--ssh-known-hosts",
        None,
        "known_hosts file that the host keys of remote workers are checked against "
        f"(default: ${KNOWN_HOSTS_VARIABLE}, else {DEFAULT_KNOWN_HOSTS}; never unchecked)",
    )
    ssh_key: str | None = flag(
        "--ssh-key",
        None,
        "private key that logs in to remote worker hosts, then only it "
        f"(default: ${CLIENT_KEY_VARIABLE}, else ~/.ssh/id_* and the SSH agent)",
    )

    def __post_init__(self) -> None:
        for name in ("ssh_known_hosts", "ssh_key"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise ValueError(f"SSHOptions {name!r} has value {value!r}; expected a file path")

    def settings(self, env: dict[str, str] | None = None) -> SSHSettings:
        """The flags, else ``env`` (default: this process's environment), else defaults."""
        env = dict(os.environ) if env is None else env
        known, known_from = _first(
            (self.ssh_known_hosts, "--ssh-known-hosts"),
            (env.get(KNOWN_HOSTS_VARIABLE), f"${KNOWN_HOSTS_VARIABLE}"),
            (DEFAULT_KNOWN_HOSTS, "default"),
        )
        key, key_from = _first(
            (self.ssh_key, "--ssh-key"),
            (env.get(CLIENT_KEY_VARIABLE), f"${CLIENT_KEY_VARIABLE}"),
            (None, "default"),
        )
        return SSHSettings(
            Path(str(known)).expanduser(),
            Path(key).expanduser() if key else None,
            known_from,
            key_from,
        )


def _first(*choices: tuple[str | None, str]) -> tuple[str | None, str]:
    """The first choice with a value (an empty variable counts as unset); the last else."""
    for value, source in choices:
        if value:
            return value, source
    return choices[-1]
