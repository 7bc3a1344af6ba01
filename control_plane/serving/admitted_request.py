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
from dynask.control_plane.serving.admission import Admission
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
        refused it (holding nothing then). At ``--max-in-flight`` it is refused at once;
        ``enter`` waits its turn instead."""
        cls._take_tenant(prepared, admission, tenant)
        return cls._admit_taken(prepared, admission, placer, tenant, beside, reserved=False)

    @classmethod
    async def enter(
        cls,
        prepared: PreparedRequest,
        admission: Admission,
        placer: Placer,
        tenant: TenantSlot | None = None,
        beside: AdmittedRequest | None = None,
    ) -> AdmittedRequest:
        """``admit``, but at ``--max-in-flight`` the request waits for a slot in weighted
        fair order (``Admission.turn``), counted against its tenant's limits meanwhile."""
        cls._take_tenant(prepared, admission, tenant)
        try:
            priority = tenant.tenant.limits.priority if tenant is not None else "normal"
            name = tenant.tenant.name if tenant is not None else ""
            reserved = await admission.turn(priority, name)
        except BaseException:
            if tenant is not None:
                tenant.release(prepared.request_id)
            raise
        return cls._admit_taken(prepared, admission, placer, tenant, beside, reserved)

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
        reserved: bool,
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
