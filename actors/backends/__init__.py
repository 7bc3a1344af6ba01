"""Engines other than the built-in one, behind the same protocol: ``echo``, ``mocker``,
``python`` (a user's file), ``vllm`` and ``openai_forward`` (``out=openai:URL``: a server
someone already runs).
"""
