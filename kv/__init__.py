"""Pure KV logic on torch tensors: block hashing, the block pool with its prefix cache and
LRU eviction, the global prefix index, KV events, offload tiers, KV transports and the
fused block copy they use (``gpu``).

Imports nothing of the project and no framework.
"""
