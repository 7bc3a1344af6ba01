"""A chat request's prompt, rendered in the HTTP layer: messages and tools through the
model's chat template (``chat_output.plan_chat``), tokenized.

The serving pipeline takes token ids; rendering here keeps the tool formats, parsers and
their options in the API layer. The request then reaches ``ServingService.prepare`` as a
prompt of token ids, with the plan's sampling overrides (the grammar of a forced tool
call, special tokens kept for formats whose markers are special tokens) merged in.
"""

from __future__ import annotations

import dataclasses

from dynask.control_plane.api.chat_output import ChatOptions, ChatPlan, plan_chat
from dynask.control_plane.api.tools.tool_request import ToolRequest
from dynask.control_plane.serving.request import GenerationRequest
from dynask.control_plane.serving.service import ServingService


def render_chat_request(
    service: ServingService,
    request: GenerationRequest,
    tools: ToolRequest | None,
    options: ChatOptions,
) -> tuple[GenerationRequest, ChatPlan]:
    """``request`` with its messages rendered into token ids, and its output plan."""
    assert request.messages is not None
    service.refuse_obviously_too_long(request)
    model = service.model(request.model)
    engines = {a.info.engine for a in model.actors}
    text, plan = plan_chat(
        model.tokenizer,
        request.messages,
        tools,
        options,
        model.name,
        engines,
    )
    ids = [int(t) for t in model.tokenizer.encode(text, add_special_tokens=False)]
    sampling = {**request.sampling, **plan.sampling}  # a forced call's grammar wins
    if plan.tool_grammar is not None and "structured_output" not in sampling:
        sampling["structured_output"] = plan.tool_grammar  # auto: the calls' arguments
    rendered = dataclasses.replace(
        request,
        messages=None,
        prompt=ids,
        sampling=sampling,
        prompt_field="messages",
    )
    return rendered, plan
