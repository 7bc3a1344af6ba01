"""Hosting engines in Dask: the engine actor, its token stream to the control plane, the KV
transfer service of disaggregated prefill, which engine to build, GPU discovery.

Imports ``actors.api``, the backends and the built-in engine; never the control plane.
"""
