"""The SSH side of remote workers (asyncssh): log in, check the environment, read a
process's output, and say what went wrong in words an operator can act on.

Host keys are checked against ``SSHSettings.known_hosts``, always; the client key is
``SSHSettings.client_key`` (then only it, no agent), else asyncssh's defaults.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import asyncssh

from dynask.control_plane.cluster.remote_commands import (
    NO_INTERPRETER,
    NO_PACKAGES,
    RemoteWorkerRequest,
    environment_check,
)
from dynask.control_plane.cluster.ssh_settings import SSHSettings

CONNECT_TIMEOUT_S = 15.0
CHECK_TIMEOUT_S = 60.0
OUTPUT_LINES_KEPT = 12


async def connect(
    request: RemoteWorkerRequest, settings: SSHSettings
) -> asyncssh.SSHClientConnection:
    """An SSH connection to the request's host, its host key verified."""
    options: dict[str, Any] = {}
    if settings.client_key is not None:
        options = {"client_keys": [str(settings.client_key)], "agent_path": None}
    return await asyncio.wait_for(
        asyncssh.connect(
            request.host,
            port=request.port,
            username=request.user,
            known_hosts=str(settings.known_hosts),
            connect_timeout=CONNECT_TIMEOUT_S,
            **options,
        ),
        CONNECT_TIMEOUT_S * 2,
    )


async def environment_problem(
    connection: asyncssh.SSHClientConnection, request: RemoteWorkerRequest
) -> str | None:
    """None if the environment runs Dask and dynask, else why not."""
    done = await asyncio.wait_for(
        connection.run(environment_check(request.environment), check=False), CHECK_TIMEOUT_S
    )
    if done.exit_status == 0:
        return None
    said = str(done.stderr or done.stdout or "").strip().splitlines()
    last = said[-1] if said else f"exit status {done.exit_status}"
    if done.exit_status == NO_INTERPRETER:
        return f"no such environment on {request.host}: {last}"
    if done.exit_status == NO_PACKAGES:
        return f"the environment {request.environment} cannot run a dynask worker: {last}"
    return f"checking the environment {request.environment} failed: {last}"


def new_output() -> collections.deque[str]:
    """Where a process's last ``OUTPUT_LINES_KEPT`` lines are kept."""
    return collections.deque(maxlen=OUTPUT_LINES_KEPT)


async def read_output(process: Any, output: collections.deque[str]) -> None:
    """Keeps ``process``'s last lines in ``output`` (the terminal's ``\\r\\n`` made
    ``\\n``) until it ends."""
    try:
        async for line in process.stdout:
            text = str(line).replace("\r", "").rstrip("\n")
            if text:
                output.append(text)
    except (asyncssh.Error, OSError) as exc:
        output.append(f"[the SSH channel broke: {exc}]")


def last_output(output: collections.deque[str]) -> str:
    return output[-1] if output else "no output"


def ssh_error_message(exc: BaseException, request: RemoteWorkerRequest, ssh: SSHSettings) -> str:
    """What went wrong connecting, with the SSH error and what to do about it."""
    where = f"{request.user}@{request.host}:{request.port}"
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return (
            f"host key refused: {exc} (checked against {ssh.known_hosts}); if the host is the "
            f"one you mean, add its key: ssh-keyscan -p {request.port} {request.host} >> "
            f"{ssh.known_hosts}"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        key = ssh.client_key or "~/.ssh/id_* and the agent"
        return f"authentication refused for {where}: {exc} (client key: {key})"
    if isinstance(exc, asyncssh.Error):
        return f"SSH error with {where}: {exc}"
    if isinstance(exc, TimeoutError):
        return f"host unreachable: {where} did not answer within {CONNECT_TIMEOUT_S:.0f}s"
    return f"host unreachable: {where}: {exc}"
