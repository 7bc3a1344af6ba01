"""The built-in torch engine (``out=torch``): scheduler, KV manager, model runner, sampling,
weights loading; its CUDA-only parts live in ``cuda``.

Imports ``kv`` and ``actors.api``; no Dask.
"""
