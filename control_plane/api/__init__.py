"""The HTTP front door: the Starlette app, the OpenAI routes, request schemas and the OpenAPI
document, SSE, OpenAI-shaped errors, the API-key guard.

Imports ``serving``, ``routing`` and ``state``; never ``cluster`` or the CLI.
"""
