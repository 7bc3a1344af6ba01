"""Benchmarks of dynask, grouped by what they measure; run each as ``python -m bench.GROUP.NAME``
from the repository root. Every one prints a table and writes JSON under ``bench/results/``.

* ``engine``: the built-in engine against HF transformers (CPU and CUDA), its step profile.
* ``serving``: the whole serving path under streaming load (control plane, soak, planner,
  the GPU stack benchmark).
* ``routing``: KV-aware routing against round-robin and random, and the router's cost.
* ``disaggregation``: KV transfer and prefill/decode disaggregation.
* ``offload``: the host and disk KV tiers.
* ``common``: helpers the groups share (processes, the streaming client, report facts).
"""
