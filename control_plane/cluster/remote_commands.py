"""What a remote worker is asked to be, and the shell lines that make it, over SSH.

Pure: no SSH, no Dask. ``RemoteWorkerRequest`` is the admin form's "Add a worker on
another host" (host, SSH port, SSH user, GPUs, environment), checked on construction;
the functions build the remote shell commands, every value quoted with ``shlex.quote``.

Design decisions:
- One ``dask worker`` process per GPU, pinned with ``CUDA_VISIBLE_DEVICES`` and offering
  ``--resources GPU=1`` (the reconciler then gives that GPU to one engine actor); 0 GPUs
  is one CPU worker. Each has a name of its own, so the launcher sees it join.
- ``--death-timeout``: a worker whose scheduler has gone away exits by itself.
- The environment is a Python interpreter or a virtual environment's folder (then its
  ``bin/python``); it must import ``distributed`` and ``dynask`` (the engine actor's
  code), which ``environment_check`` verifies before any worker starts.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass

MAX_GPUS = 16
DEATH_TIMEOUT_S = 60
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[?[0-9A-Fa-f:.]+\]?")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
# The exit status of ``environment_check`` when the interpreter is missing (as a shell's).
NO_INTERPRETER = 127
NO_PACKAGES = 3


def _invalid(field_name: str, value: object, expected: str) -> ValueError:
    return ValueError(f"Remote worker {field_name!r} has value {value!r}; expected {expected}")


@dataclass(frozen=True)
class RemoteWorkerRequest:
    """Start ``gpus`` workers (or one CPU worker) on ``host`` as ``user``, in ``environment``."""

    host: str
    user: str
    environment: str  # a python executable or a virtual environment's folder
    port: int = 22
    gpus: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not _HOST.fullmatch(self.host):
            raise _invalid("host", self.host, "a host name or an IP address")
        if not isinstance(self.user, str) or not _USER.fullmatch(self.user):
            raise _invalid("user", self.user, "a user name (letters, digits, _ . -)")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise _invalid("port", self.port, "an integer from 1 to 65535")
        if not 1 <= self.port <= 65535:
            raise _invalid("port", self.port, "an integer from 1 to 65535")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int):
            raise _invalid("gpus", self.gpus, f"an integer from 0 to {MAX_GPUS}")
        if not 0 <= self.gpus <= MAX_GPUS:
            raise _invalid("gpus", self.gpus, f"an integer from 0 to {MAX_GPUS}")
        env = self.environment
        if not isinstance(env, str) or not env.startswith(("/", "~/")) or "\n" in env:
            raise _invalid(
                "environment", env, "an absolute path of a python or a virtual environment"
            )

    @property
    def gpu_indices(self) -> list[int | None]:
        """The GPU each worker is pinned to; ``[None]``: one CPU worker."""
        return list(range(self.gpus)) if self.gpus else [None]


def is_loopback(host: str) -> bool:
    """Is ``host`` this machine's loopback (``localhost``, ``127.x``, ``::1``)?"""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def worker_name(serial: int, host: str, gpu: int | None) -> str:
    """``remote-3-gpu-node-1-gpu0``: unique per launch (``serial``), says where it runs."""
    place = re.sub(r"[^A-Za-z0-9-]", "-", host).strip("-") or "host"
    return f"remote-{serial}-{place}-{'cpu' if gpu is None else f'gpu{gpu}'}"


def _python(environment: str) -> str:
    """A shell word for the interpreter: ``environment`` itself, or its ``bin/python``
    when it is a folder (decided on the remote host)."""
    path = environment.replace("~/", "$HOME/", 1) if environment.startswith("~/") else environment
    quoted = f'"{path}"' if path.startswith("$HOME/") else shlex.quote(path)
    return f'"$(if [ -d {quoted} ]; then echo {quoted}/bin/python; else echo {quoted}; fi)"'


def environment_check(environment: str) -> str:
    """A command that exits 0 and prints the versions if ``environment`` runs Dask and
    dynask; ``NO_INTERPRETER`` when it is no interpreter, ``NO_PACKAGES`` when one is
    missing (its error on stderr)."""
    script = (
        "import sys, distributed, dynask; "
        "print(sys.executable, 'distributed', distributed.__version__)"
    )
    return (
        f"PY={_python(environment)}; "
        f'if [ ! -x "$PY" ]; then echo "$PY is not an executable python" >&2; '
        f"exit {NO_INTERPRETER}; fi; "
        f'"$PY" -c {shlex.quote(script)} || exit {NO_PACKAGES}'
    )


def worker_command(environment: str, scheduler: str, name: str, gpu: int | None) -> str:
    """The ``dask worker`` of one GPU (or the CPU), joining ``scheduler`` as ``name``."""
    args = [
        *("-m", "distributed.cli.dask_worker", scheduler),
        *("--name", name, "--nthreads", "1", "--no-dashboard"),
        *("--death-timeout", str(DEATH_TIMEOUT_S)),
    ]
    if gpu is not None:
        args += ["--resources", "GPU=1"]
    pin = "" if gpu is None else f"CUDA_VISIBLE_DEVICES={gpu} "
    words = " ".join(shlex.quote(a) for a in args)
    return f'cd / && PY={_python(environment)} && exec env {pin}"$PY" {words}'
