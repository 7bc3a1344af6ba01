"""Rendering a chat with tools through the model's chat template.

Templates that know tools (they read ``tools`` and ``message.tool_calls``) get them as
transformers' ``apply_chat_template(..., tools=...)`` passes them. A template that does
not (SmolLM2's, for one) gets dynask's default: the tools described in a system message
in the Hermes ``<tool_call>`` format, earlier calls written back as that markup, and tool
results as ``<tool_response>`` user turns, so any chat model can be offered tools. Which
one a model gets is logged once per model.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from dynask.control_plane.api.tools.tool_request import ToolRequest

log = logging.getLogger(__name__)

_DEFAULT_INSTRUCTIONS = (
    "# Tools\n\nYou can call functions to help with the user's request. Their signatures, "
    "as JSON schemas, are inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, write one JSON object per call, with the function's name and "
    "its arguments, inside <tool_call></tool_call> tags:\n<tool_call>\n"
    '{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>'
)
_logged: set[str] = set()


def template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the tool one when there is one
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else ""


def knows_tools(tokenizer: Any) -> bool:
    template = template_text(tokenizer)
    return "tools" in template and "tool_calls" in template


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: ToolRequest | None, model: str
) -> str:
    """The prompt text of ``messages`` (and the tools, unless ``tool_choice`` is none)."""
    offered = None
    if tools is not None and tools.offered:
        offered = [t.openai_shape() for t in tools.tools]
    uses_tools = offered is not None or any(_has_tool_parts(m) for m in messages)
    if uses_tools and not knows_tools(tokenizer):
        if model not in _logged:
            _logged.add(model)
            log.info(
                "model '%s': its chat template has no tool support; tools are described "
                "in dynask's default Hermes-style <tool_call> format",
                model,
            )
        messages, offered = default_tool_messages(messages, offered), None
    text = tokenizer.apply_chat_template(
        messages, tools=offered, add_generation_prompt=True, tokenize=False
    )
    return str(text)


def _has_tool_parts(message: dict[str, Any]) -> bool:
    return message["role"] == "tool" or bool(message.get("tool_calls"))


def default_tool_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` in dynask's default tool format, for a template that knows no tools."""
    out = [_plain(m) for m in messages]
    if tools:
        described = "\n".join(json.dumps(t) for t in tools)
        instructions = _DEFAULT_INSTRUCTIONS.format(tools=described)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {
            "role": "user",
            "content": f"<tool_response>\n{message['content']}\n</tool_response>",
        }
    calls = message.get("tool_calls")
    if not calls:
        return {"role": message["role"], "content": message["content"]}
    written = [
        "<tool_call>\n"
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        + "\n</tool_call>"
        for c in calls
    ]
    content = "\n".join([message["content"], *written] if message["content"] else written)
    return {"role": "assistant", "content": content}
