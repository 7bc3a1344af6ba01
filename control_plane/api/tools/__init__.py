"""Tool calling on the chat API: the request's ``tools`` and ``tool_choice``, rendering tool
definitions and tool messages through the model's chat template, and the parsers that turn
the model's tool-call markup (Hermes ``<tool_call>``, Llama JSON, Mistral ``[TOOL_CALLS]``,
pythonic lists) into OpenAI ``tool_calls``, whole or streamed, and the grammar that holds
the calls to their functions' schemas (``tool_grammar``).

Text processing: imports nothing of the project but ``control_plane.api.errors`` and
``actors.api.structured_output`` (the grammar spec as it travels to an engine).
"""
