"""Workers on other hosts, started over SSH (asyncssh) and joined to this scheduler.

``RemoteWorkers.add`` takes a ``RemoteWorkerRequest`` (host, SSH port and user, GPUs,
environment) and returns at once with one ``RemoteWorker`` per GPU (or one CPU worker),
``starting``; in the background it connects, checks the environment, starts the
``dask worker`` processes (``remote_commands``) and watches each join the scheduler
(``joined``) or fail (``failed``, with the SSH error or the process's last output). A
joined worker can be retired; retiring removes it. Every step is written to the event log.

Design decisions:
- Host keys are always verified, against ``SSHSettings.known_hosts`` (``ssh_settings``:
  ``--ssh-known-hosts``, ``$DYNASK_SSH_KNOWN_HOSTS``, default ``~/.ssh/known_hosts``). A
  missing file or an unknown key is a failure that says how to trust the host; there is
  no switch that turns the check off.
- The client key is ``--ssh-key`` / ``$DYNASK_SSH_KEY`` (then only that key, no agent),
  else asyncssh's defaults (``~/.ssh/id_*`` and the agent).
- Each worker runs under a pseudo-terminal on the SSH connection that started it: when
  the connection closes (retired, or this control plane stopped or died), sshd hangs up
  the terminal and the worker process ends with it. Nothing is left running unowned.
- So the workers are kept in the database (``RemoteWorkerStore``), each with its last
  state: when the control plane starts again, ``restore`` logs in again and starts the
  ones that were ``starting`` or ``joined`` under their old names; one that cannot be
  started is shown ``exited`` with the reason. A control plane that stops leaves their
  rows as they were, for the next one.
- A scheduler that listens on loopback only cannot be reached from another host: such an
  add is refused with the reason, not left to time out.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncssh

from dynask.control_plane.cluster.cluster_admin import ClusterActionError, ClusterAdmin
from dynask.control_plane.cluster.remote_commands import (
    RemoteWorkerRequest,
    is_loopback,
    worker_command,
    worker_name,
)
from dynask.control_plane.cluster.remote_ssh import (
    connect,
    environment_problem,
    last_output,
    new_output,
    read_output,
    ssh_error_message,
)
from dynask.control_plane.cluster.ssh_settings import KNOWN_HOSTS_VARIABLE, SSHSettings
from dynask.control_plane.state.remote_worker_store import (
    NewRemoteWorker,
    RemoteWorkerRecord,
    RemoteWorkerStore,
)
from dynask.control_plane.state.repository import Repository

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 120.0
JOIN_POLL_S = 0.5
WHO = "remote-workers"  # the event log's "who" of what happens in the background
RUNNING = ("starting", "joined")
RESTART_FAILED = "could not be started again when the control plane restarted: "


@dataclass
class RemoteWorker:
    """One ``dask worker`` process on another host, as the admin UI shows it."""

    id: int  # its stored row's
    name: str
    request: RemoteWorkerRequest
    gpu: int | None  # the GPU it is pinned to; None: a CPU worker
    who: str
    added_at: datetime
    state: str = "starting"  # starting | joined | failed | exited | retiring | retired
    detail: str = "connecting over SSH"
    address: str | None = None  # its worker address, once joined
    joined_at: datetime | None = None
    restarted: bool = False  # being started again after a restart (until it joins)
    output: collections.deque[str] = field(default_factory=new_output)
    process: Any = None  # asyncssh.SSHClientProcess

    @property
    def where(self) -> str:
        r = self.request
        return f"{r.user}@{r.host}:{r.port}"

    @classmethod
    def of(cls, record: RemoteWorkerRecord) -> RemoteWorker:
        """The worker a stored row describes, in its stored state (no process yet)."""
        request = RemoteWorkerRequest(
            host=record.host,
            user=record.ssh_user,
            environment=record.environment,
            port=record.port,
            gpus=0 if record.gpu is None else 1,  # this worker's own share of its add
        )
        worker = cls(record.id, record.name, request, record.gpu, record.who, record.created_at)
        worker.state, worker.joined_at = record.state, record.joined_at
        worker.detail = record.last_error or record.state
        return worker


class RemoteWorkers:
    """Starts, watches and retires workers on other hosts; owns their SSH connections and
    keeps them in the database (``RemoteWorkerStore``)."""

    def __init__(self, cluster: ClusterAdmin, repo: Repository, settings: SSHSettings) -> None:
        self.cluster = cluster
        self.repo = repo
        self.settings = settings
        self.store = RemoteWorkerStore(repo.engine)
        self._workers: dict[int, RemoteWorker] = {}
        self._last_launch = 0
        self._connections: dict[int, asyncssh.SSHClientConnection] = {}  # by worker id
        self._background: set[asyncio.Task[None]] = set()
        self._closing = False

    def workers(self) -> list[RemoteWorker]:
        return sorted(self._workers.values(), key=lambda w: w.id)

    async def add(self, request: RemoteWorkerRequest, who: str) -> list[RemoteWorker]:
        """Records the workers ``starting`` and starts them in the background; raises
        ``ClusterActionError`` when they cannot be started from here at all."""
        scheduler = self._scheduler_for(request.host)
        self._check_known_hosts(request)
        launch = max(self._last_launch, await asyncio.to_thread(self.store.next_launch) - 1) + 1
        self._last_launch = launch
        wanted = [
            NewRemoteWorker(
                worker_name(launch, request.host, gpu),
                request.host,
                request.port,
                request.user,
                gpu,
                request.environment,
            )
            for gpu in request.gpu_indices
        ]
        records = await asyncio.to_thread(self.store.add, launch, wanted, who)
        workers = [RemoteWorker.of(record) for record in records]
        for worker in workers:
            worker.request, worker.detail = request, "connecting over SSH"
            self._workers[worker.id] = worker
            await self._log(who, "worker.remote.starting", worker, {"gpu": worker.gpu})
        self._in_background(self._launch(workers, scheduler))
        return workers

    async def restore(self) -> None:
        """Shows the stored workers and starts again the ones that were starting or
        joined (their processes ended with the previous control plane's connections);
        one that cannot be started is ``exited`` with the reason. Call it once the
        cluster has started."""
        records = await asyncio.to_thread(self.store.list)
        self._last_launch = max([self._last_launch, *(r.launch for r in records)])
        again: dict[int, list[RemoteWorker]] = {}
        for record in records:
            worker = RemoteWorker.of(record)
            self._workers[worker.id] = worker
            if worker.state in RUNNING:
                worker.state, worker.restarted = "starting", True
                worker.detail = "starting again: the control plane restarted"
                again.setdefault(record.launch, []).append(worker)
                await self._log(WHO, "worker.remote.restarting", worker, {"gpu": worker.gpu})
        for workers in again.values():
            try:
                scheduler = self._scheduler_for(workers[0].request.host)
                self._check_known_hosts(workers[0].request)
            except ClusterActionError as exc:
                await self._fail_all(workers, str(exc))
                continue
            self._in_background(self._launch(workers, scheduler))

    def _check_known_hosts(self, request: RemoteWorkerRequest) -> None:
        known_hosts = self.settings.known_hosts
        if not known_hosts.is_file():
            raise ClusterActionError(
                f"host keys are checked against {known_hosts}, which does not exist; trust "
                f"the host first: ssh-keyscan -p {request.port} {request.host} >> {known_hosts} "
                f"(or choose another file with --ssh-known-hosts or {KNOWN_HOSTS_VARIABLE})"
            )

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
        """Closes a running worker (the scheduler first moves its data away) and ends its
        process; its actors are lost and the reconciler replaces them elsewhere. Either
        way the worker is removed (a failed or exited one is only removed)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            raise ClusterActionError(f"no remote worker has the id {worker_id}")
        if worker.state not in RUNNING:
            if worker.state == "retiring":
                raise ClusterActionError(f"remote worker {worker.name} is retiring already")
            await self._remove(worker)
            await self._log(who, "worker.remote.removed", worker, {"state": worker.state})
            return worker
        worker.state, worker.detail = "retiring", "closing the worker"
        client: Any = self.cluster.runtime.client
        if worker.address is not None and client is not None:
            await client.retire_workers(workers=[worker.address], close_workers=True)
        await self._end(worker, "retired", f"retired by {who}")
        await self._remove(worker)
        await self._log(who, "worker.remote.retired", worker, {"address": worker.address})
        self._in_background(self.cluster.runtime.reconcile())
        return worker

    async def _remove(self, worker: RemoteWorker) -> None:
        self._workers.pop(worker.id, None)
        await asyncio.to_thread(self.store.remove, worker.id)

    async def close(self) -> None:
        """Ends every remote worker's process (the control plane is stopping); their
        stored states stay, so the next control plane starts them again."""
        self._closing = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for worker in self.workers():
            if worker.state in RUNNING:
                await self._end(worker, worker.state, "the control plane stopped")

    async def _launch(self, workers: list[RemoteWorker], scheduler: str) -> None:
        request = workers[0].request
        try:
            connection = await connect(request, self.settings)
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            await self._fail_all(workers, ssh_error_message(exc, request, self.settings))
            return
        for worker in workers:
            self._connections[worker.id] = connection
        problem = await environment_problem(connection, request)
        if problem is not None:
            await self._fail_all(workers, problem)
            return
        await asyncio.gather(*(self._start_worker(w, connection, scheduler) for w in workers))

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
        reading = asyncio.create_task(read_output(worker.process, worker.output))
        address = await self._wait_joined(worker)
        if address is None:
            reading.cancel()
            return
        worker.address = address
        stored = await asyncio.to_thread(self.store.set_state, worker.id, "joined")
        await self._log(WHO, "worker.remote.joined", worker, {"address": address})
        if worker.state != "starting":  # retired meanwhile
            reading.cancel()
            return
        worker.state, worker.detail, worker.restarted = "joined", f"joined as {address}", False
        worker.joined_at = stored.joined_at if stored is not None else None
        self._in_background(self.cluster.runtime.reconcile())
        await reading  # until the process ends
        if worker.state == "joined":  # it ended by itself
            ended = f"the worker process ended: {last_output(worker.output)}"
            await self._fail(worker, ended, "exited")

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
                await self._fail(worker, f"dask worker exited: {last_output(worker.output)}")
                return None
            info = await client.scheduler.identity(n_workers=-1)
            for address, seen in info["workers"].items():
                if seen.get("name") == worker.name:
                    return str(address)
            await asyncio.sleep(JOIN_POLL_S)
        await self._fail(
            worker, f"did not join within {JOIN_TIMEOUT_S:.0f}s: {last_output(worker.output)}"
        )
        return None

    async def _fail_all(self, workers: list[RemoteWorker], message: str) -> None:
        for worker in workers:
            await self._fail(worker, message)

    async def _fail(self, worker: RemoteWorker, message: str, state: str = "failed") -> None:
        """Ends ``worker`` as ``state`` with ``message``, stored and logged; one being
        started again after a restart ends ``exited``, saying so. Not while the control
        plane stops (its stored state stays, for the next one)."""
        if self._closing or worker.state not in RUNNING:
            return  # stopping, or retired meanwhile
        if worker.restarted:
            state, message = "exited", RESTART_FAILED + message
        log.warning("remote worker %s (%s): %s", worker.name, worker.where, message)
        # Stored and logged before the state changes: whoever sees it ended sees why.
        await asyncio.to_thread(self.store.set_state, worker.id, state, message)
        await self._log(WHO, f"worker.remote.{state}", worker, {"error": message})
        await self._end(worker, state, message)

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
