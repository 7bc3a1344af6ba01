"""What runs inside Dask workers: the engine-neutral boundary (``api``), the runtime that
hosts engines in Dask actors (``runtime``), the backends (``backends``) and the built-in
torch engine (``engine``).

Imports ``kv``; never the control plane, the web UI, Starlette or SQLAlchemy.
"""
