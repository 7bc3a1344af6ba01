"""Engines other than the built-in one, behind the same protocol: ``echo``, ``mocker``,
``python`` (a user's file) and ``vllm``.
"""
