"""An aggregated inference graph: Frontend -> Processor -> Worker.

    dynask serve deploy/graphs/agg.py:Frontend -f deploy/graphs/agg.yaml \
        --scheduler tcp://HOST:8786

The Processor here is the built-in one (the control plane templates, tokenizes and
routes); ``agg_rewrite.py`` shows a custom one.
"""

from dynask.control_plane.graphs.components import Frontend, Processor, Worker
from dynask.control_plane.graphs.sdk import depends, service


@service(resources={"gpu": 1}, workers=1)
class LLMWorker(Worker):
    """The engine: one actor per replica (``ServiceArgs.workers`` in the YAML)."""


class AggProcessor(Processor):
    worker = depends(LLMWorker)


Frontend.link(AggProcessor).link(LLMWorker)
