"""Inference graphs: the SDK, the built-in components, the YAML config, running a graph and
storing it.
"""
