"""Structured outputs in the built-in engine: xgrammar matchers per request and the token
mask applied to the logits each step. Imports ``actors.api`` and the grammar library only.
"""
