"""The engine-neutral boundary: the Engine protocol every backend implements, the request,
output and stats types they share (and the prompt check every engine applies,
``engine_inputs``), and the typed description of an engine actor.

With ``actors.runtime`` (hosting engines) and ``actors.models`` (tokenizers), this is what
the control plane imports of ``actors``. It imports ``kv`` and nothing else of the project.
"""
