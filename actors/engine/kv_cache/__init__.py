"""The built-in engine's KV cache: the block manager and prefix cache (``manager``), how
many blocks fit a device (``sizing``), the offload tiers' wiring (``tiers``), and what
other threads and engines do with it under the step lock (``access``, ``handoff``)."""
