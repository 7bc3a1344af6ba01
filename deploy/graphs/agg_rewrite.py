"""The aggregated graph with a custom Processor that rewrites prompts.

    dynask serve deploy/graphs/agg_rewrite.py:Frontend -f deploy/graphs/agg_rewrite.yaml \
        --scheduler tcp://HOST:8786

``RewritingProcessor`` runs as a Dask actor; every chat or completions request passes
through its ``process`` before the control plane tokenizes and routes it.
"""

from typing import Any

from dynask.control_plane.graphs.components import Frontend, Processor, Worker
from dynask.control_plane.graphs.sdk import depends


class RewriteWorker(Worker):
    pass


class RewritingProcessor(Processor):
    """Prefixes every user message (or prompt) with the YAML's ``prefix``."""

    worker = depends(RewriteWorker)

    def process(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["model"] != self.worker.model:  # the handle: RewriteWorker's deployment
            raise ValueError(f"this graph serves {self.worker.model!r}, not {request['model']!r}")
        prefix = str(self.config.get("prefix", ""))
        if request["messages"] is not None:
            for message in request["messages"]:
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    message["content"] = prefix + message["content"]
        elif isinstance(request["prompt"], str):
            request["prompt"] = prefix + request["prompt"]
        return request


Frontend.link(RewritingProcessor).link(RewriteWorker)
