"""A real OpenSSH server for the remote-worker tests (Debian's ``openssh-server``).

It runs on a free local port as the test's own user, with its own ``sshd_config``
(``-f``), a throw-away host key, a throw-away client key in its ``authorized_keys`` and a
throw-away ``known_hosts`` that trusts its host key: nothing of the machine's own SSH
setup is read or changed. A second key that the server does not know is made too, for
the "wrong key" case, and an empty ``known_hosts`` for the "unknown host key" case.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.control_plane import server_process as sp
from tests.system_tools import require

START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class SSHServer:
    host: str
    port: int
    user: str
    client_key: Path  # in authorized_keys
    unknown_key: Path  # not in authorized_keys
    known_hosts: Path  # trusts the server's host key
    empty_known_hosts: Path  # trusts nothing
    log: Path


def _keygen(path: Path) -> str:
    """Makes an ed25519 key pair at ``path``; its public line."""
    keygen = require("ssh-keygen")
    subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        timeout=30,
    )
    return path.with_suffix(".pub").read_text().strip()


def _config(folder: Path, port: int, user: str, host_key: Path) -> Path:
    lines = [
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {host_key}",
        f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        f"AllowUsers {user}",
        "UsePAM no",
        "StrictModes no",  # the tmp folder's modes are not the home folder's
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",  # CI runs the tests as root
        "LogLevel VERBOSE",
    ]
    path = folder / "sshd_config"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def running_sshd(folder: Path) -> Iterator[SSHServer]:
    """A started ``sshd -D`` on a free port; stopped on the way out."""
    sshd = require("/usr/sbin/sshd")
    folder.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    host_key = folder / "host_ed25519"
    host_line = _keygen(host_key)
    (folder / "authorized_keys").write_text(_keygen(folder / "client_ed25519") + "\n")
    _keygen(folder / "unknown_ed25519")
    port = sp.free_port()
    known_hosts = folder / "known_hosts"
    key_type, key_body = host_line.split()[:2]
    known_hosts.write_text(f"[127.0.0.1]:{port} {key_type} {key_body}\n")
    (folder / "empty_known_hosts").write_text("")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    log = folder / "sshd.log"
    config = _config(folder, port, user, host_key)
    proc = sp.start([sshd, "-D", "-e", "-f", str(config)], log)
    try:
        _wait_listening(port, proc, log)
        yield SSHServer(
            host="127.0.0.1",
            port=port,
            user=user,
            client_key=folder / "client_ed25519",
            unknown_key=folder / "unknown_ed25519",
            known_hosts=known_hosts,
            empty_known_hosts=folder / "empty_known_hosts",
            log=log,
        )
    finally:
        sp.stop(proc)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"sshd not listening on {port} after {START_TIMEOUT_S}s:\n{log.read_text()}")
