"""The grammar that holds a chat request's tool calls to the functions' schemas.

``tool_grammar`` gives the structured output (as it travels, ``StructuredOutput.to_wire``)
of a request that offers tools, for engines that follow a grammar (out=torch, out=vllm):

- ``required`` and a named function: the output is tool calls and nothing else, each
  call's arguments valid against its function's ``parameters`` schema.
- ``auto``: the output is free text until the model opens a tool call (the format's
  opening text, ``<tool_call>`` for Hermes); from there the call's name is one of the
  tools' and its arguments follow that tool's schema, until the call closes.

Design decisions:

* The calls are written in the model's own format whenever xgrammar knows it as a
  structural tag (Hermes/Qwen ``<tool_call>`` JSON, Llama 3 JSON): the prompt teaches
  that format, so the grammar asks the model for what it would write anyway. xgrammar's
  built-in structural tags (``get_model_structural_tag``) are used, not a copy of them.
* A format xgrammar has no structural tag for (Mistral, pythonic) gets, when a call is
  forced, bare JSON: the named function's arguments object, or an array of
  ``{"name", "parameters"}`` objects (vLLM's shape for ``required``); under ``auto`` its
  output is not constrained. The parsers read both shapes (``ForcedCallStream``).
* ``required``: the output is one or more calls and nothing else (xgrammar's built-in
  tag lets free text follow the first call; here only another call or the end may), so a
  model cannot ramble after its calls until ``max_tokens``.
* Whitespace inside the arguments is bounded (``MAX_WHITESPACE``): a model, small ones
  especially, could otherwise write blanks until ``max_tokens``.
* A reasoning model (``<think>`` blocks) keeps its reasoning: the grammar lets a block
  come first (or continue the one the prompt opened), and constrains what follows.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from dynask.actors.api.structured_output import StructuredOutput
from dynask.control_plane.api.tools.formats import ToolFormat
from dynask.control_plane.api.tools.tool_request import ToolRequest

# Our format -> the model key of xgrammar's built-in structural tag for it, and what
# separates calls when the output is calls only (``required``).
STRUCTURAL_TAG_MODELS = {"hermes": "qwen_3", "llama3_json": "llama"}
CALL_SEPARATORS = {"hermes": "\n", "llama3_json": "; "}
MAX_WHITESPACE = 2


def writes_native_calls(fmt: ToolFormat) -> bool:
    """Whether the grammar of ``fmt`` holds calls in the format's own markup (else bare
    JSON when forced, nothing under ``auto``)."""
    return fmt.name in STRUCTURAL_TAG_MODELS


def tool_grammar(
    tools: ToolRequest, fmt: ToolFormat, reasoning: bool, opens_block: bool
) -> dict[str, Any] | None:
    """The structured output that enforces ``tools``' calls in ``fmt``, or None (the tools
    are not offered, or ``auto`` in a format without a structural tag)."""
    if not tools.offered:
        return None
    if writes_native_calls(fmt):
        tag = _structural_tag(tools, fmt, reasoning, opens_block)
        return StructuredOutput("structural_tag", tag).to_wire()
    schema = tools.arguments_schema()
    if schema is None:  # auto: nothing to hold the model to in this format
        return None
    return StructuredOutput("json_schema", json.dumps(schema, ensure_ascii=False)).to_wire()


def _structural_tag(tools: ToolRequest, fmt: ToolFormat, reasoning: bool, opens: bool) -> str:
    from xgrammar import get_model_structural_tag

    choice: Any = tools.choice
    if tools.choice == "named":
        choice = {"type": "function", "function": {"name": tools.named}}
    mode: Literal["enabled", "disabled", "auto"] = (
        "disabled" if not reasoning else ("enabled" if opens else "auto")
    )
    tag = get_model_structural_tag(
        STRUCTURAL_TAG_MODELS[fmt.name],
        tools=[tool.openai_shape() for tool in tools.tools],
        tool_choice=choice,
        reasoning=mode,
        max_whitespace_cnt=MAX_WHITESPACE,
        parallel_tool_calls=tools.parallel and tools.choice != "named",
    )
    if tools.choice == "required":
        tag = _calls_only(tag, CALL_SEPARATORS[fmt.name])
    text: str = tag.model_dump_json()
    return text


def _calls_only(tag: Any, separator: str) -> Any:
    """The built-in ``required`` tag with free text between and after the calls removed:
    its triggered tags become tags joined by ``separator``."""
    from xgrammar.structural_tag import SequenceFormat, TagsWithSeparatorFormat

    def rewrite(fmt: Any) -> Any:
        if isinstance(fmt, SequenceFormat):  # a reasoning block, then the calls
            return SequenceFormat(elements=[*fmt.elements[:-1], rewrite(fmt.elements[-1])])
        return TagsWithSeparatorFormat(
            tags=fmt.tags,
            separator=separator,
            at_least_one=True,
            stop_after_first=fmt.stop_after_first,
        )

    return tag.model_copy(update={"format": rewrite(tag.format)})
