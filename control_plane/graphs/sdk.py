"""The inference-graph SDK: components, their dependencies, and the links between them.

    @service(resources={"gpu": 1}, workers=2)
    class MyWorker(Worker): ...

    class MyProcessor(Processor):
        worker = depends(MyWorker)

    Frontend.link(MyProcessor).link(MyWorker)

A component is a class marked with ``@service`` (the built-ins in ``graph_components``
already are). ``A.link(B)`` adds the edge A -> B and returns B, so links chain.
``depends(B)`` declares that a component needs B: the graph is rejected if B is not in
it, and at run time the attribute is a handle to B's deployment. ``build_graph(Root)``
walks the links from the root into a ``Graph``; every mistake is named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

C = TypeVar("C", bound=type)

_SPEC_ATTR = "_dynask_service"
_LINKS_ATTR = "_dynask_links"


@dataclass(frozen=True)
class ServiceSpec:
    """What ``@service`` records: replicas (``workers``) and resources per replica."""

    workers: int = 1
    resources: dict[str, int] = field(default_factory=dict)


def service(*, resources: dict[str, int] | None = None, workers: int = 1) -> Callable[[C], C]:
    """Marks a class as a graph component with ``workers`` replicas and ``resources``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ValueError(f"@service 'workers' has value {workers!r}; expected an integer >= 0")
    spec = ServiceSpec(workers, dict(resources or {}))
    check_resources(spec.resources, "@service")

    def mark(cls: C) -> C:
        setattr(cls, _SPEC_ATTR, spec)
        setattr(cls, _LINKS_ATTR, [])  # links are the class's own, never inherited
        if not hasattr(cls, "link"):
            cls.link = classmethod(_link)  # type: ignore[attr-defined]
        return cls

    return mark


def check_resources(resources: Any, where: str) -> None:
    if not isinstance(resources, dict):
        raise ValueError(f"{where} 'resources' has value {resources!r}; expected a mapping")
    for key, value in resources.items():
        if key != "gpu":
            raise ValueError(f"{where} resource {key!r} is not known; known: gpu")
        if not isinstance(value, int) or isinstance(value, bool) or value not in (0, 1):
            raise ValueError(
                f"{where} resource 'gpu' has value {value!r}; expected 0 or 1 (one engine "
                "actor holds at most one GPU)"
            )


def service_spec(cls: type) -> ServiceSpec:
    spec = cls.__dict__.get(_SPEC_ATTR) or getattr(cls, _SPEC_ATTR, None)
    if not isinstance(spec, ServiceSpec):
        raise ValueError(
            f"{cls.__qualname__} is not a graph component; mark it with @service(...) or "
            "subclass a built-in (Frontend, Processor, Worker)"
        )
    return spec


def _own_links(cls: type) -> list[type]:
    if _LINKS_ATTR not in cls.__dict__:
        setattr(cls, _LINKS_ATTR, [])
    links: list[type] = cls.__dict__[_LINKS_ATTR]
    return links


def _link(cls: type, other: type) -> type:
    """``cls.link(other)``: the edge cls -> other; returns ``other`` so links chain."""
    service_spec(cls)
    service_spec(other)
    if other is cls:
        raise ValueError(
            f"{cls.__qualname__}.link({cls.__qualname__}): a component links to itself"
        )
    links = _own_links(cls)
    if other not in links:
        links.append(other)
    return other


class Component:
    """Base of the built-in components: gives ``link`` to every subclass."""

    kind = "custom"

    @classmethod
    def link(cls, other: type) -> type:
        return _link(cls, other)


def unlink_all(*classes: type) -> None:
    """Forgets the links of ``classes`` (tests and re-loaded modules start clean)."""
    for cls in classes:
        setattr(cls, _LINKS_ATTR, [])


class Dependency:
    """``depends(Other)``: a typed need; on an instance, the handle the runtime gave."""

    def __init__(self, target: type) -> None:
        service_spec(target)
        self.target = target
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return self
        handles: dict[str, Any] = instance.__dict__.get("_dynask_handles", {})
        if self.name not in handles:
            raise RuntimeError(
                f"{owner.__qualname__}.{self.name} (depends on {self.target.__qualname__}) "
                "is not wired: the graph runtime sets it when the component runs"
            )
        return handles[self.name]


def depends(target: type) -> Any:
    """Declares that the enclosing component needs ``target``."""
    return Dependency(target)


def dependencies(cls: type) -> dict[str, Dependency]:
    found: dict[str, Dependency] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Dependency):
                found[name] = value
    return found


@dataclass(frozen=True)
class Graph:
    """Components reachable from ``root`` by links, in walk order, and the links."""

    root: type
    components: list[type]
    links: list[tuple[type, type]]

    def names(self) -> list[str]:
        return [c.__name__ for c in self.components]

    def describe(self) -> dict[str, Any]:
        """JSON-able form, as stored and shown on the admin UI."""
        return {
            "components": [
                {
                    "name": c.__name__,
                    "kind": getattr(c, "kind", "custom"),
                    "class": f"{c.__module__}.{c.__qualname__}",
                    "workers": service_spec(c).workers,
                    "resources": service_spec(c).resources,
                }
                for c in self.components
            ],
            "links": [[a.__name__, b.__name__] for a, b in self.links],
        }


def build_graph(root: type) -> Graph:
    """Walks ``root``'s links; rejects unmarked classes, duplicate names and dependencies
    on components outside the graph."""
    service_spec(root)
    order: list[type] = []
    links: list[tuple[type, type]] = []
    pending = [root]
    while pending:
        cls = pending.pop(0)
        if cls in order:
            continue
        order.append(cls)
        for target in _own_links(cls):
            links.append((cls, target))
            pending.append(target)
    by_name: dict[str, type] = {}
    for cls in order:
        if cls.__name__ in by_name:
            raise ValueError(
                f"two components of the graph are named {cls.__name__!r} "
                f"({by_name[cls.__name__].__module__} and {cls.__module__}); rename one"
            )
        by_name[cls.__name__] = cls
    for cls in order:
        for attr, dep in dependencies(cls).items():
            if not any(issubclass(c, dep.target) for c in order):
                raise ValueError(
                    f"{cls.__name__}.{attr} depends on {dep.target.__name__}, which is not in "
                    f"the graph of {root.__name__}; add .link({dep.target.__name__})"
                )
    return Graph(root, order, links)
