"""Helpers the benchmark groups share: managed processes, the streaming client and
its percentiles, and the facts every JSON report records."""
