"""The built-in graph components and the hook a custom Processor overrides.

- ``Frontend``: the control plane's OpenAI-compatible HTTP server (one per graph).
  Settings: ``served_model_name``, ``port`` (``--port`` wins).
- ``Processor``: templating, tokenization and routing, done by the control plane.
  Settings: ``router`` (kv | round-robin | ...), ``kv-overlap-weight``,
  ``router-temperature``. A subclass that overrides ``process`` runs as a Dask actor,
  and every request passes through it before it is tokenized and routed.
- ``Worker`` / ``PrefillWorker`` / ``DecodeWorker``: engine deployments (role
  aggregated / prefill / decode). Settings: ``model``, ``engine``, ``role`` and the
  engine's own arguments (``kv-cache-gib``, ``max-num-seqs``, ...); ``workers`` replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynask.control_plane.graphs.sdk import Component, service
from dynask.control_plane.state.deployment import Role

PROCESSED_KEYS = ("messages", "prompt")
"""What ``Processor.process`` may change; the rest of a request is not its to touch."""


@service(workers=1)
class Frontend(Component):
    kind = "frontend"


@service(workers=1)
class Processor(Component):
    """``process(request) -> request`` sees ``{"model", "messages", "prompt"}`` (chat
    requests have messages, completions a prompt) and returns it, changed or not. The
    YAML section's settings (other than the router's) are in ``self.config``."""

    kind = "processor"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def process(self, request: dict[str, Any]) -> dict[str, Any]:
        return request


@dataclass(frozen=True)
class DeploymentRef:
    """What a custom Processor's ``depends(SomeWorker)`` attribute is at run time: the
    Worker's deployment and the model name requests for it carry."""

    deployment: str
    model: str


class ProcessorActor:
    """The Dask actor that holds a custom Processor. The class arrives pickled by value
    (``cloudpickle``): workers and the scheduler need not have the user's graph file."""

    def __init__(
        self,
        pickled_class: bytes,
        config: dict[str, Any],
        handles: dict[str, DeploymentRef] | None = None,
    ) -> None:
        import cloudpickle

        self.processor = cloudpickle.loads(pickled_class)(config)
        self.processor.__dict__["_dynask_handles"] = dict(handles or {})

    def process(self, request: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.processor.process(request)
        return result


def overrides_process(cls: type) -> bool:
    return issubclass(cls, Processor) and cls.process is not Processor.process


@service(resources={"gpu": 1}, workers=1)
class Worker(Component):
    kind = "worker"
    role = Role.AGGREGATED


@service(resources={"gpu": 1}, workers=1)
class PrefillWorker(Worker):
    role = Role.PREFILL


@service(resources={"gpu": 1}, workers=1)
class DecodeWorker(Worker):
    role = Role.DECODE
