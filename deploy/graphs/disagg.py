"""A disaggregated inference graph: Frontend -> Processor -> DecodeWorker -> PrefillWorker.

    dynask serve deploy/graphs/disagg.py:Frontend -f deploy/graphs/disagg.yaml \
        --scheduler tcp://HOST:8786

Long prompts are prefilled by the PrefillWorker's engines and their KV sent to the
DecodeWorker's (see "Disaggregated prefill and decode" in the README).
"""

from dynask.control_plane.graphs.components import DecodeWorker, Frontend, PrefillWorker, Processor
from dynask.control_plane.graphs.sdk import depends


class Prefill(PrefillWorker):
    pass


class Decode(DecodeWorker):
    prefill = depends(Prefill)


class DisaggProcessor(Processor):
    worker = depends(Decode)


Frontend.link(DisaggProcessor).link(Decode).link(Prefill)
