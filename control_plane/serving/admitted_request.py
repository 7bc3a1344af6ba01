"""``AdmittedRequest``: the one owner of everything an admitted request holds.

A request, once admitted, holds four things: its place in its tenant's limits
(``tenants.TenantSlot``), its admission slot (``Admission``: the
in-flight count and its queued prefill tokens), its count in its actor's load and, when
disaggregated, its prefill plan (the last two in a ``Placement``). They are taken in
``admit`` and given back by ``release``, exactly once, whatever path the request ends on:
it finished, its client went away, its engine failed, it was refused on the way, or it
moved to another actor (``move_to`` gives back the old placement as it takes the new).

Use it as a context manager (``with admitted: ...``); ``release`` may also be called on
its own (a streamed response whose body never started) and is a no-op the second time.
"""

from __future__ import annotations

from types import TracebackType

from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.admission import Admission, Reservation
from dynask.control_plane.serving.placer import Placement, Placer
from dynask.control_plane.serving.request import PreparedRequest
from dynask.control_plane.serving.tenants import TenantSlot


class AdmittedRequest:
    """An admitted request and what it holds; see the module docstring."""

    def __init__(
        self, prepared: PreparedRequest, admission: Admission, tenant: TenantSlot | None = None
    ) -> None:
        self.prepared = prepared
        self._admission = admission
        self._tenant = tenant
        self._placement: Placement | None = None
        self._released = False

    @classmethod
    def admit(
        cls,
        prepared: PreparedRequest,
        admission: Admission,
        placer: Placer,
        tenant: TenantSlot | None = None,
        beside: AdmittedRequest | None = None,
    ) -> AdmittedRequest:
        """Takes the request's place in its tenant's limits, its admission slot, then
        places it (on ``beside``'s actor, for a sibling choice); raises the
        ``TenantLimitError``, ``AdmissionRefusedError`` or ``UnavailableError`` that
        refused it (holding nothing then). At an admission limit it is refused at once;
        ``enter_group`` waits its turn instead."""
        cls._take_tenant(prepared, admission, tenant)
        return cls._admit_taken(prepared, admission, placer, tenant, beside, None)

    @classmethod
    async def enter_group(
        cls,
        groups: list[list[PreparedRequest]],
        admission: Admission,
        placer: Placer,
        tenant: TenantSlot | None = None,
        beside: AdmittedRequest | None = None,
    ) -> list[list[AdmittedRequest]]:
        """``admit``, but at an admission limit the requests wait for room for all of them
        at once, in weighted fair order (``Admission.turn``), counted against their
        tenant's limits meanwhile. For one request pass ``[[prepared]]``; for the choices
        of one response, one group per prompt: the first of each group is placed as any
        request, the others beside it (its siblings share its prompt's KV). All are
        admitted or none."""
        flat = [prepared for group in groups for prepared in group]
        taken: list[PreparedRequest] = []
        try:
            for prepared in flat:
                cls._take_tenant(prepared, admission, tenant)
                taken.append(prepared)
            priority = tenant.tenant.limits.priority if tenant is not None else "normal"
            name = tenant.tenant.name if tenant is not None else ""
            tokens = sum(len(prepared.prompt_ids) for prepared in flat)
            reserved = await admission.turn(priority, name, len(flat), tokens)
        except BaseException:
            if tenant is not None:
                for prepared in taken:
                    tenant.release(prepared.request_id)
            raise
        admitted: list[list[AdmittedRequest]] = []
        done = 0
        try:
            for group in groups:
                first = cls._admit_taken(group[0], admission, placer, tenant, beside, reserved)
                done += 1
                row = [first]
                admitted.append(row)
                for prepared in group[1:]:
                    row.append(
                        cls._admit_taken(prepared, admission, placer, tenant, first, reserved)
                    )
                    done += 1
        except BaseException:
            for row in admitted:
                for item in row:
                    item.release()
            if tenant is not None:  # the one that failed gave its place back already
                for prepared in flat[done + 1 :]:
                    tenant.release(prepared.request_id)
            raise
        finally:
            admission.give_back(reserved)  # what requests that never came in held
        return admitted

    @staticmethod
    def _take_tenant(
        prepared: PreparedRequest, admission: Admission, tenant: TenantSlot | None
    ) -> None:
        if tenant is not None:
            tokens = len(prepared.prompt_ids) + prepared.params.max_tokens
            tenant.take(prepared.request_id, tokens)

    @classmethod
    def _admit_taken(
        cls,
        prepared: PreparedRequest,
        admission: Admission,
        placer: Placer,
        tenant: TenantSlot | None,
        beside: AdmittedRequest | None,
        reserved: Reservation | None,
    ) -> AdmittedRequest:
        request_id = prepared.request_id
        try:
            admission.admit(request_id, len(prepared.prompt_ids), reserved)
        except BaseException:
            if tenant is not None:
                tenant.release(request_id)
            raise
        admitted = cls(prepared, admission, tenant)
        try:
            if beside is None:
                admitted._placement = placer.place(prepared)
            else:
                admitted._placement = placer.place_beside(beside.placement, prepared)
        except BaseException:
            admitted.release()
            raise
        return admitted

    @property
    def request_id(self) -> str:
        return self.prepared.request_id

    @property
    def placement(self) -> Placement:
        if self._placement is None:
            raise RuntimeError(f"request {self.request_id} has no placement")
        return self._placement

    @property
    def actor(self) -> ActorHandle:
        return self.placement.actor

    @property
    def released(self) -> bool:
        return self._released

    def first_token(self) -> None:
        """Its first delta arrived: its prompt no longer waits for prefill."""
        self._admission.prefill_done(self.request_id)

    def leave_actor(self) -> None:
        """Its actor was lost: uncount it there now, before it is placed again."""
        if self._placement is not None:
            self._placement.release()

    def move_to(self, placement: Placement) -> None:
        """Continues on ``placement`` (a migration), giving back the previous one."""
        if self._released:
            placement.release()
            raise RuntimeError(f"request {self.request_id} has ended; it cannot move")
        self.leave_actor()
        self._placement = placement

    def release(self) -> None:
        """Gives back the placement and the admission slot; only the first call acts."""
        if self._released:
            return
        self._released = True
        self.leave_actor()
        self._admission.release(self.request_id)
        if self._tenant is not None:
            self._tenant.release(self.request_id)

    def __enter__(self) -> AdmittedRequest:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
