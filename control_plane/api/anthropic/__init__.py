"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``).

A Messages request is translated into a chat request (``request``) and served by the
chat pipeline; its output is written as Anthropic content blocks and stream events
(``blocks``); errors are Anthropic-shaped (``{"type": "error", "error": {...}}``).
"""
