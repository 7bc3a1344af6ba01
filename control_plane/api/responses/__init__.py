"""The Responses API (``/v1/responses``): create (streamed or whole), retrieve, delete.

A Responses request is translated into a chat request (``request``) and served by the
same pipeline as ``/v1/chat/completions``; its output is written as Responses items and
events (``items``). Stored responses live in ``state.response_store``.
"""
