"""``in=text`` and ``in=batch``: the serving pipeline, driven from the terminal.

The same path an HTTP request takes (``ServingService``: prepare, admit, generate, with
its routing, migration and disaggregated prefill) over an embedded cluster of engine
actors (``ClusterRuntime``), with no HTTP in between: so any ``out=`` engine works here,
and a request behaves as it would over the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from dynask.actors.api.outputs import RequestOutput
from dynask.control_plane.cluster.gpu_placement import WorkerPlacement
from dynask.control_plane.cluster.pools import PoolPlacement
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.request import GenerationRequest, PreparedRequest
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import DeploymentSpec

ID_PREFIX = "cli"


@dataclass(frozen=True)
class LocalPipeline:
    """A started serving pipeline and the model it serves."""

    service: ServingService
    model: str
    max_tokens: int  # per reply, unless a request says otherwise
    temperature: float | None  # None: the model's default (``sampling_defaults``)

    def request(
        self,
        *,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> GenerationRequest:
        """A chat (``messages``) or completion (``prompt``) request to the model."""
        chosen = self.temperature if temperature is None else temperature
        return GenerationRequest(
            model=self.model,
            messages=messages,
            prompt=prompt,
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            sampling={} if chosen is None else {"temperature": chosen},
            stream=True,
            include_usage=True,
        )

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Tokenized and checked against the model (``InvalidRequestError`` if not)."""
        return self.service.prepare(request, ID_PREFIX)

    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[RequestOutput]:
        """The request's deltas, in order; raises the pipeline's ``ServingError``s."""
        admitted = self.service.admit(prepared)
        async for outputs in self.service.generate(admitted):
            for output in outputs:
                yield output

    async def stream(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """``prepare`` then ``generate``."""
        async for output in self.generate(self.prepare(request)):
            yield output


@asynccontextmanager
async def local_pipeline(
    deployments: list[DeploymentSpec],
    n_workers: int,
    *,
    max_tokens: int,
    temperature: float | None,
    routing: RoutingOptions | None = None,
    disagg: DisaggOptions | None = None,
    reliability: ReliabilityOptions | None = None,
    placements: Sequence[WorkerPlacement] = (),
    scheduler_address: str | None = None,
    placement: PoolPlacement | None = None,
) -> AsyncIterator[LocalPipeline]:
    """Starts an embedded cluster with ``deployments`` (or uses the one at
    ``scheduler_address``; ``placement``: a pool's, ``out=dyn://POOL``), returns once their
    engines are ready, and stops them on the way out."""
    service = ServingService(ServingMetrics(), routing, disagg, reliability)
    runtime = ClusterRuntime(
        service,
        deployments,
        scheduler_address=scheduler_address,
        n_workers=n_workers,
        gpu_placements=placements,
    )
    if placement is not None:
        runtime.use_placement(placement)
    try:
        await runtime.start()
        model = deployments[0].model_name
        yield LocalPipeline(service, model, max_tokens, temperature)
    finally:
        await runtime.stop()
