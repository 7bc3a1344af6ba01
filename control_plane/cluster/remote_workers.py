"""Workers on other hosts, started over SSH (asyncssh) and joined to this scheduler.

``RemoteWorkers.add`` takes a ``RemoteWorkerRequest`` (host, SSH port and user, GPUs,
environment) and returns at once with one ``RemoteWorker`` per GPU (or one CPU worker),
``starting``; in the background it connects, checks the environment, starts the
``dask worker`` processes (``remote_commands``) and watches each join the scheduler
(``joined``) or fail (``failed``, with the SSH error or the process's last output). A
joined worker can be retired. Every step is written to the event log.

Design decisions:
- Host keys are always verified, against ``SSHSettings.known_hosts``
  (``$DYNASK_SSH_KNOWN_HOSTS``, default ``~/.ssh/known_hosts``). A missing file or an
  unknown key is a failure that says how to trust the host; there is no switch that
  turns the check off.
- The client key is ``$DYNASK_SSH_KEY`` (then only that key, no agent), else asyncssh's
  defaults (``~/.ssh/id_*`` and the agent).
- Each worker runs under a pseudo-terminal on the SSH connection that started it: when
  the connection closes (retired, or this control plane stopped or died), sshd hangs up
  the terminal and the worker process ends with it. Nothing is left running unowned.
- A scheduler that listens on loopback only cannot be reached from another host: such an
  add is refused with the reason, not left to time out.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from dynask.control_plane.cluster.cluster_admin import ClusterActionError, ClusterAdmin
from dynask.control_plane.cluster.remote_commands import (
    NO_INTERPRETER,
    NO_PACKAGES,
    RemoteWorkerRequest,
    environment_check,
    is_loopback,
    worker_command,
    worker_name,
)
from dynask.control_plane.state.repository import Repository

log = logging.getLogger(__name__)

KNOWN_HOSTS_VARIABLE = "DYNASK_SSH_KNOWN_HOSTS"
CLIENT_KEY_VARIABLE = "DYNASK_SSH_KEY"
CONNECT_TIMEOUT_S = 15.0
CHECK_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 120.0
JOIN_POLL_S = 0.5
OUTPUT_LINES_KEPT = 12
WHO = "remote-workers"  # the event log's "who" of what happens in the background


@dataclass(frozen=True)
class SSHSettings:
    """Where host keys are checked and which client key logs in."""

    known_hosts: Path
    client_key: Path | None = None  # None: ~/.ssh/id_* and the agent

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> SSHSettings:
        env = dict(os.environ) if env is None else env
        known = env.get(KNOWN_HOSTS_VARIABLE) or "~/.ssh/known_hosts"
        key = env.get(CLIENT_KEY_VARIABLE)
        return cls(Path(known).expanduser(), Path(key).expanduser() if key else None)


@dataclass
class RemoteWorker:
    """One ``dask worker`` process on another host, as the admin UI shows it."""

    id: int
    name: str
    request: RemoteWorkerRequest
    gpu: int | None  # the GPU it is pinned to; None: a CPU worker
    who: str
    state: str = "starting"  # starting | joined | failed | retiring | retired | exited
    detail: str = "connecting over SSH"
    address: str | None = None  # its worker address, once joined
    output: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES_KEPT)
    )
    process: Any = None  # asyncssh.SSHClientProcess

    @property
    def where(self) -> str:
        r = self.request
        return f"{r.user}@{r.host}:{r.port}"


class RemoteWorkers:
    """Starts, watches and retires workers on other hosts; owns their SSH connections."""

    def __init__(self, cluster: ClusterAdmin, repo: Repository, settings: SSHSettings) -> None:
        self.cluster = cluster
        self.repo = repo
        self.settings = settings
        self._workers: dict[int, RemoteWorker] = {}
        self._ids = itertools.count(1)
        self._serials = itertools.count(1)
        self._connections: dict[int, asyncssh.SSHClientConnection] = {}  # by worker id
        self._background: set[asyncio.Task[None]] = set()

    def workers(self) -> list[RemoteWorker]:
        return sorted(self._workers.values(), key=lambda w: w.id)

    async def add(self, request: RemoteWorkerRequest, who: str) -> list[RemoteWorker]:
        """Records the workers ``starting`` and starts them in the background; raises
        ``ClusterActionError`` when they cannot be started from here at all."""
        scheduler = self._scheduler_for(request.host)
        if not self.settings.known_hosts.is_file():
            raise ClusterActionError(
                f"host keys are checked against {self.settings.known_hosts}, which does not "
                f"exist; trust the host first: ssh-keyscan -p {request.port} {request.host} "
                f">> {self.settings.known_hosts} (set {KNOWN_HOSTS_VARIABLE} for another file)"
            )
        serial = next(self._serials)
        workers = [
            RemoteWorker(next(self._ids), worker_name(serial, request.host, gpu), request, gpu, who)
            for gpu in request.gpu_indices
        ]
        for worker in workers:
            self._workers[worker.id] = worker
            await self._log(who, "worker.remote.starting", worker, {"gpu": worker.gpu})
        self._in_background(self._launch(workers, scheduler))
        return workers

    def _scheduler_for(self, host: str) -> str:
        address = self.cluster.scheduler_address
        if address is None or self.cluster.runtime.client is None:
            raise ClusterActionError("the cluster is still starting; try again in a moment")
        scheduler_host = address.removeprefix("tcp://").rsplit(":", 1)[0]
        if is_loopback(scheduler_host) and not is_loopback(host):
            raise ClusterActionError(
                f"the scheduler listens on {address}, which {host} cannot reach; run the "
                "scheduler on an address the other hosts reach (dask scheduler --host ADDRESS, "
                "then dynask serve --scheduler tcp://ADDRESS:8786)"
            )
        return address

    async def retire(self, worker_id: int, who: str) -> RemoteWorker:
        """Closes a joined worker (the scheduler first moves its data away) and ends its
        process; its actors are lost and the reconciler replaces them elsewhere."""
        worker = self._workers.get(worker_id)
        if worker is None:
            raise ClusterActionError(f"no remote worker has the id {worker_id}")
        if worker.state not in ("joined", "starting"):
            raise ClusterActionError(f"remote worker {worker.name} is {worker.state}, not running")
        worker.state, worker.detail = "retiring", "closing the worker"
        client: Any = self.cluster.runtime.client
        if worker.address is not None and client is not None:
            await client.retire_workers(workers=[worker.address], close_workers=True)
        await self._end(worker, "retired", f"retired by {who}")
        await self._log(who, "worker.remote.retired", worker, {"address": worker.address})
        self._in_background(self.cluster.runtime.reconcile())
        return worker

    async def close(self) -> None:
        """Ends every remote worker (the control plane is stopping)."""
        for worker in self.workers():
            if worker.state in ("starting", "joined"):
                await self._end(worker, "retired", "the control plane stopped")
        for task in list(self._background):
            task.cancel()

    async def _launch(self, workers: list[RemoteWorker], scheduler: str) -> None:
        request = workers[0].request
        try:
            connection = await self._connect(request)
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            await self._fail_all(workers, ssh_error_message(exc, request, self.settings))
            return
        for worker in workers:
            self._connections[worker.id] = connection
        problem = await self._check_environment(connection, request)
        if problem is not None:
            await self._fail_all(workers, problem)
            return
        await asyncio.gather(*(self._start_worker(w, connection, scheduler) for w in workers))

    async def _connect(self, request: RemoteWorkerRequest) -> asyncssh.SSHClientConnection:
        key = self.settings.client_key
        options: dict[str, Any] = {}
        if key is not None:
            options = {"client_keys": [str(key)], "agent_path": None}
        return await asyncio.wait_for(
            asyncssh.connect(
                request.host,
                port=request.port,
                username=request.user,
                known_hosts=str(self.settings.known_hosts),
                connect_timeout=CONNECT_TIMEOUT_S,
                **options,
            ),
            CONNECT_TIMEOUT_S * 2,
        )

    async def _check_environment(
        self, connection: asyncssh.SSHClientConnection, request: RemoteWorkerRequest
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

    async def _start_worker(
        self, worker: RemoteWorker, connection: asyncssh.SSHClientConnection, scheduler: str
    ) -> None:
        command = worker_command(worker.request.environment, scheduler, worker.name, worker.gpu)
        worker.detail = "started; waiting for it to join the scheduler"
        try:  # a pseudo-terminal: the process ends when the connection does
            worker.process = await connection.create_process(
                command, term_type="dumb", stderr=asyncssh.STDOUT
            )
        except (asyncssh.Error, OSError) as exc:
            await self._fail(worker, f"starting dask worker over SSH failed: {exc}")
            return
        reading = asyncio.create_task(_read_output(worker))
        address = await self._wait_joined(worker)
        if address is None:
            reading.cancel()
            return
        worker.state, worker.address = "joined", address
        worker.detail = f"joined as {address}"
        await self._log(WHO, "worker.remote.joined", worker, {"address": address})
        self._in_background(self.cluster.runtime.reconcile())
        await reading  # until the process ends
        if worker.state == "joined":  # it ended by itself
            await self._fail(worker, f"the worker process ended: {_last_output(worker)}", "exited")

    async def _wait_joined(self, worker: RemoteWorker) -> str | None:
        """The worker's address once the scheduler has it; None (and ``failed``) if its
        process ends first or it does not join within ``JOIN_TIMEOUT_S``."""
        client: Any = self.cluster.runtime.client
        deadline = asyncio.get_running_loop().time() + JOIN_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            if worker.state != "starting":
                return None  # retired meanwhile
            if worker.process.exit_status is not None or worker.process.is_closing():
                await asyncio.sleep(JOIN_POLL_S)  # the rest of its output
                await self._fail(worker, f"dask worker exited: {_last_output(worker)}")
                return None
            info = await client.scheduler.identity(n_workers=-1)
            for address, seen in info["workers"].items():
                if seen.get("name") == worker.name:
                    return str(address)
            await asyncio.sleep(JOIN_POLL_S)
        await self._fail(
            worker, f"did not join within {JOIN_TIMEOUT_S:.0f}s: {_last_output(worker)}"
        )
        return None

    async def _fail_all(self, workers: list[RemoteWorker], message: str) -> None:
        for worker in workers:
            await self._fail(worker, message)

    async def _fail(self, worker: RemoteWorker, message: str, state: str = "failed") -> None:
        log.warning("remote worker %s (%s): %s", worker.name, worker.where, message)
        await self._end(worker, state, message)
        await self._log(WHO, f"worker.remote.{state}", worker, {"error": message})

    async def _end(self, worker: RemoteWorker, state: str, detail: str) -> None:
        """Sets the final state, ends the process and closes a connection nobody uses."""
        worker.state, worker.detail = state, detail
        if worker.process is not None:
            worker.process.close()
        connection = self._connections.pop(worker.id, None)
        if connection is not None and connection not in self._connections.values():
            connection.close()
            await connection.wait_closed()

    async def _log(self, who: str, kind: str, worker: RemoteWorker, extra: dict[str, Any]) -> None:
        r = worker.request
        details = {"host": r.host, "port": r.port, "user": r.user, "environment": r.environment}
        await asyncio.to_thread(self.repo.log_event, who, kind, worker.name, {**details, **extra})

    def _in_background(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("remote worker task failed", exc_info=task.exception())


async def _read_output(worker: RemoteWorker) -> None:
    """Keeps the process's last lines (the terminal's ``\\r\\n`` made ``\\n``)."""
    try:
        async for line in worker.process.stdout:
            text = str(line).replace("\r", "").rstrip("\n")
            if text:
                worker.output.append(text)
    except (asyncssh.Error, OSError) as exc:
        worker.output.append(f"[the SSH channel broke: {exc}]")


def _last_output(worker: RemoteWorker) -> str:
    return worker.output[-1] if worker.output else "no output"


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
