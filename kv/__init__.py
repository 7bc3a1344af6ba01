"""Pure KV logic on torch tensors: block hashing, the block pool with its prefix cache and
LRU eviction, the global prefix index, KV events, offload tiers, KV transports.

Imports nothing of the project and no framework.
"""
