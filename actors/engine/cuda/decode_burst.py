"""Decode bursts: several greedy decode steps run back to back, one host sync at the end.

At batch 1 on a GPU a decode step's kernels take ~4.6 ms and the host work between two
steps (the sync on the sampled ids, postprocess, scheduling, building the next inputs,
launching the graph) leaves the GPU idle for another ~0.6 ms. When the step is decode
only, every row is greedy and nobody is waiting for admission, the next step's inputs
are known without the host: the token is the argmax of this step's logits, the position
and KV slot follow from the blocks the sequence already holds. A burst of ``k`` steps
reserves the blocks for ``k`` tokens, lets the runner chain the steps on the device, and
applies the ``k`` results one step at a time through the scheduler's ordinary
postprocess, so stop tokens, stop strings, ``max_tokens`` and prefix-cache registration
behave exactly as in single steps. A sequence that stops inside a burst had at most
``k - 1`` tokens computed in vain; their KV went into blocks it owned and is discarded
with them.

The cost is latency for arrivals: a request that comes in during a burst waits for it
(``k`` steps) before it is admitted, and tokens reach clients ``k`` at a time. A burst
therefore never starts while a request is waiting. Measured on an H200 (issue 19, 8B
bf16, bursts of 8): 8% / 21% / 23% less time per decode step at batch 1 / 64 / 256; the
``k`` results are still applied serially after the chain, so the host work is not hidden.
Bursts stay off by default (``EngineConfig.decode_burst = 1``): a streaming client would
see its tokens ``k`` at a time, ITL ``k`` times longer per chunk.
"""

from __future__ import annotations

from dynask.actors.engine.kv_cache.manager import KVCacheManager
from dynask.actors.engine.scheduler import SchedulerOutput


def burst_steps(out: SchedulerOutput, kv: KVCacheManager, limit: int, max_model_len: int) -> int:
    """How many steps ``out`` may run as one burst (1: run it as a single step).

    ``out`` must be decode only and greedy. The burst is cut to the fewest tokens any of
    its sequences may still produce, and to 1 when the blocks for it cannot be reserved.
    """
    if limit <= 1 or out.preempted or not out.chunks:
        return 1
    steps = limit
    for chunk in out.chunks:
        seq = chunk.seq
        if chunk.num_new_tokens != 1 or seq.num_computed_tokens == 0 or not chunk.samples:
            return 1
        logits_steps = seq.params.processes_logits or seq.params.logprobs is not None
        if not seq.params.greedy or seq.grammar is not None or logits_steps:  # per-step logits
            return 1
        remaining = min(
            seq.params.max_tokens - len(seq.output_token_ids), max_model_len - seq.num_tokens
        )
        steps = min(steps, remaining)
    if steps <= 1:
        return 1
    # The scheduler reserved one token's slot per sequence; reserve the rest of the burst.
    # Blocks reserved before a failure stay with their sequence and serve its next steps.
    if all(kv.allocate(chunk.seq, steps) for chunk in out.chunks):
        return steps
    return 1
