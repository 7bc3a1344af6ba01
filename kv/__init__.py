"""dynask.kv."""
