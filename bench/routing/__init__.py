"""KV-aware routing against round-robin and random routing, and the cost of a decision."""
