"""The "workers on other hosts" page: add workers over SSH, watch them join, retire them.

The form's values become a ``RemoteWorkerRequest`` (whose checks name the field at fault);
``RemoteWorkers`` does the SSH work in the background, so the POST answers at once and
the table (polled by htmx) shows each worker go from starting to joined, or to failed
with the SSH error. Every action is CSRF-checked (``checked_form``), logged in as the
admin, and written to the event log (by ``RemoteWorkers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from dynask.control_plane.cluster.cluster_admin import ClusterActionError
from dynask.control_plane.cluster.remote_commands import MAX_GPUS, RemoteWorkerRequest
from dynask.control_plane.cluster.remote_workers import RemoteWorkers
from dynask.web.auth import checked_form, current_user, flash
from dynask.web.deps import AdminDeps
from dynask.web.templating import BASE

PAGE = "remote_workers.html"
FIELDS = ("host", "port", "user", "gpus", "environment")
_INTEGERS = {"port": "an integer from 1 to 65535", "gpus": f"an integer from 0 to {MAX_GPUS}"}


@dataclass
class RemoteWorkerForm:
    """The add form's raw values (shown again when wrong) and its per-field errors."""

    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> RemoteWorkerForm:
        return cls({"port": "22", "gpus": "0"})

    @classmethod
    def from_form(cls, form: FormData) -> RemoteWorkerForm:
        return cls({name: str(form.get(name) or "").strip() for name in FIELDS})

    def request(self) -> RemoteWorkerRequest | None:
        """The request the values make; None (and ``errors`` set) when they make none."""
        numbers: dict[str, int] = {}
        for name, expected in _INTEGERS.items():
            try:
                numbers[name] = int(self.values.get(name, ""))
            except ValueError:
                self.errors[name] = f"'{self.values.get(name, '')}' is not {expected}"
        for name in ("host", "user", "environment"):
            if not self.values.get(name):
                self.errors[name] = "required"
        if self.errors:
            return None
        try:
            return RemoteWorkerRequest(
                host=self.values["host"],
                user=self.values["user"],
                environment=self.values["environment"],
                **numbers,
            )
        except ValueError as exc:  # "Remote worker 'NAME' has value ..."
            self.errors[str(exc).split("'")[1]] = str(exc)
            return None


def make_remote_routes(deps: AdminDeps, remote: RemoteWorkers) -> list[Route]:
    render = deps.renderer

    def context(form: RemoteWorkerForm) -> dict[str, Any]:
        return {
            "page": "workers",
            "form": form,
            "remote": remote.workers(),
            "ssh": remote.settings,
            "scheduler": deps.cluster.scheduler_address,
            "max_gpus": MAX_GPUS,
        }

    async def page(request: Request) -> Response:
        return render.page(request, PAGE, context(RemoteWorkerForm.empty()))

    async def table(request: Request) -> Response:
        return render.block_response(request, PAGE, "remote_table", context(RemoteWorkerForm()))

    async def add(request: Request) -> Response:
        form = RemoteWorkerForm.from_form(await checked_form(request))
        wanted = form.request()
        if wanted is None:
            return render.page(request, PAGE, context(form), status_code=400)
        try:
            started = await remote.add(wanted, current_user(request))
        except ClusterActionError as exc:
            form.errors["host"] = str(exc)
            return render.page(request, PAGE, context(form), status_code=400)
        names = ", ".join(w.name for w in started)
        flash(request, "ok", f"Starting {names} on {wanted.host} over SSH.")
        return _back()

    async def retire(request: Request) -> Response:
        await checked_form(request)
        try:
            retired = await remote.retire(int(request.path_params["id"]), current_user(request))
        except ClusterActionError as exc:
            flash(request, "error", str(exc))
            return _back()
        done = "retired" if retired.state == "retired" else "removed"
        flash(request, "ok", f"Remote worker {retired.name} {done}.")
        return _back()

    return [
        Route("/workers/remote", page, methods=["GET"], name="remote_workers"),
        Route("/workers/remote/table", table, methods=["GET"]),
        Route("/workers/remote", add, methods=["POST"], name="add_remote_worker"),
        Route("/workers/remote/{id:int}/retire", retire, methods=["POST"]),
    ]


def _back() -> Response:
    return RedirectResponse(f"{BASE}/workers/remote", status_code=303)
