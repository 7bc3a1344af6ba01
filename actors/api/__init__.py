"""The engine-neutral boundary: the Engine protocol every backend implements, the request,
output and stats types they share, and the typed description of an engine actor.

This is the only part of ``actors`` the control plane imports. It imports ``kv`` and
nothing else of the project.
"""
