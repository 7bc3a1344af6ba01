"""Decoding what an engine actor sends across the Dask wire into a dataclass, so that
control planes and workers of neighbouring versions can run side by side.

Design decisions:

- A field the dataclass requires and the dict lacks is an error that names it: the two
  sides disagree about the boundary, and a default would hide it (a renamed counter
  would read 0).
- A field the dict carries and the dataclass does not know is logged and ignored. It is
  what a newer actor sends an older control plane during a rolling upgrade; refusing it
  made the older control plane refuse the actor at start (``ActorInfo``) or judge every
  heartbeat failed (``EngineStats``), so the actor was declared lost and restarted over
  and over. A field added to the boundary therefore needs a default, so that an older
  actor, which does not send it, still decodes.
- Each decoder reports each set of unknown fields once, at WARNING, naming them: a
  heartbeat decodes stats every second per actor, and the log should say it once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WireDecoder(Generic[T]):
    """Builds ``cls`` from a dict that crossed the wire; see the module docstring."""

    def __init__(self, cls: type[T], what: str, derived: Collection[str] = ()) -> None:
        self._cls = cls
        self._what = what  # how messages name the dict: "engine actor info"
        self._known = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
        self._derived = frozenset(derived)  # sent for readers, recomputed here
        self._reported: set[frozenset[str]] = set()

    def unknown_fields(self, data: Mapping[str, Any]) -> list[str]:
        """The keys of ``data`` this side neither reads nor recomputes, sorted."""
        return sorted(set(data) - self._known - self._derived)

    def decode(self, data: Mapping[str, Any]) -> T:
        if not isinstance(data, Mapping):
            raise ValueError(f"{self._what} must be a dict, got {data!r}")
        unknown = self.unknown_fields(data)
        if unknown and frozenset(unknown) not in self._reported:
            self._reported.add(frozenset(unknown))
            log.warning(
                "unknown fields in %s, ignored (sent by a newer engine actor?): %s",
                self._what,
                ", ".join(unknown),
            )
        try:
            return self._cls(**{k: v for k, v in data.items() if k in self._known})
        except TypeError as exc:  # a required field is missing
            raise ValueError(f"incomplete {self._what}: {exc}") from exc
