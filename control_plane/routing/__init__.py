"""Where a request goes: the KV-aware router, each model's prefix indices and routers, and
keeping the indices in step with the actors' KV events.
"""
