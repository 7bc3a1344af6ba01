"""How a chat request's output is read: reasoning, content and tool calls.

``plan_chat`` renders the prompt (with tools) and decides, once per request, which
parsers its output goes through: the reasoning parser (``<think>`` blocks) first, then
the tool-call parser on what is left. ``ChatOutputParser`` applies them to one choice's
deltas; the chat, Responses and Messages formats all read its ``ChatDelta``s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynask.control_plane.api.errors import invalid
from dynask.control_plane.api.reasoning import (
    ReasoningStream,
    check_parser_name,
    detect_reasoning,
    prompt_opens_block,
)
from dynask.control_plane.api.structured_output_fields import grammar_problem
from dynask.control_plane.api.tools.formats import (
    ToolFormat,
    detect_format,
    tool_format,
)
from dynask.control_plane.api.tools.templating import knows_tools, render_chat, template_text
from dynask.control_plane.api.tools.tool_grammar import tool_grammar, writes_native_calls
from dynask.control_plane.api.tools.tool_request import ToolRequest
from dynask.control_plane.api.tools.tool_stream import (
    ForcedCallStream,
    ToolCall,
    ToolCallDelta,
    ToolStream,
)
from dynask.control_plane.serving.structured_output_support import SERVING_ENGINES

# Engines whose text is not a model's: they cannot call tools.
NO_TOOL_ENGINES = ("echo", "mocker")


@dataclass(frozen=True)
class ChatOptions:
    """The server's ``--tool-call-parser`` and ``--reasoning-parser``."""

    tool_call_parser: str | None = None  # None: the format the model's template teaches
    reasoning_parser: str | None = None  # None: when the template knows <think>; "none": off

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None:
            tool_format(self.tool_call_parser)
        if self.reasoning_parser is not None:
            check_parser_name(self.reasoning_parser)


@dataclass(frozen=True)
class ChatDelta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass(frozen=True)
class ChatPlan:
    """What one chat request's output goes through."""

    tools: ToolRequest | None = None
    tool_format: ToolFormat | None = None  # None: no tool parsing
    reasoning: bool = False
    opens_block: bool = False  # the prompt opened a <think> block already
    sampling: dict[str, Any] = field(default_factory=dict)  # overrides of SamplingParams
    # The grammar of the tool calls (``tool_grammar``): under ``auto`` it applies only when
    # the request asks for no other structured output.
    tool_grammar: dict[str, Any] | None = None

    @property
    def parses(self) -> bool:
        return self.reasoning or (self.tools is not None and self.tools.offered)

    def parser(self) -> ChatOutputParser:
        return ChatOutputParser(self)


class ChatOutputParser:
    """One choice's deltas -> reasoning, content and tool-call deltas."""

    def __init__(self, plan: ChatPlan) -> None:
        self._reasoning = ReasoningStream(plan.opens_block) if plan.reasoning else None
        tools = plan.tools
        self._tools: ToolStream | ForcedCallStream | None = None
        if tools is not None and tools.offered:
            native = plan.tool_format or tool_format("hermes")
            native_grammar = plan.tool_grammar is not None and writes_native_calls(native)
            if tools.forced and native_grammar:  # the grammar writes the model's markup
                self._tools = ToolStream(native, tools.parallel and tools.named is None)
            elif tools.forced:
                self._tools = ForcedCallStream(tools.named, native, tools.parallel)
            else:
                self._tools = ToolStream(native, tools.parallel)

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools is not None else []

    def feed(self, text: str) -> ChatDelta:
        return self._split(text, final=False)

    def finish(self) -> ChatDelta:
        return self._split("", final=True)

    def _split(self, text: str, final: bool) -> ChatDelta:
        reasoning, content = "", text
        if self._reasoning is not None:
            piece = self._reasoning.finish() if final else self._reasoning.feed(text)
            reasoning, content = piece.reasoning, piece.content
        if self._tools is None:
            return ChatDelta(content, reasoning)
        parsed = self._tools.feed(content) if content else None
        calls = list(parsed.tool_calls) if parsed else []
        content = parsed.content if parsed else ""
        if final:
            rest = self._tools.finish()
            content += rest.content
            calls += rest.tool_calls
        return ChatDelta(content, reasoning, _merge(calls))

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """``tool_calls`` when the model stopped after calling tools."""
        if engine_reason == "stop" and self.calls:
            return "tool_calls"
        return engine_reason


def _merge(calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Pieces of the same call from one delta, as one piece."""
    merged: list[ToolCallDelta] = []
    for piece in calls:
        if merged and merged[-1].index == piece.index:
            last = merged[-1]
            arguments = last.arguments + piece.arguments
            merged[-1] = ToolCallDelta(last.index, last.id, last.name, arguments)
        else:
            merged.append(piece)
    return merged


def plan_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: ToolRequest | None,
    options: ChatOptions,
    model: str,
    engines: set[str],
) -> tuple[str, ChatPlan]:
    """The prompt text and the output plan of one chat request."""
    if tools is not None and tools.offered and engines & set(NO_TOOL_ENGINES):
        engine = sorted(engines & set(NO_TOOL_ENGINES))[0]
        raise invalid(
            "tools",
            f"the model '{model}' is served by the {engine} engine, which writes no model "
            "text and cannot call tools; serve it with out=torch, out=vllm or out=python:FILE.py",
        )
    text = render_chat(tokenizer, messages, tools, model)
    template = template_text(tokenizer)
    reasoning = (
        detect_reasoning(template)
        if options.reasoning_parser is None
        else options.reasoning_parser != "none"
    )
    fmt = None
    if tools is not None and tools.offered:
        if options.tool_call_parser is not None:
            fmt = tool_format(options.tool_call_parser)
        elif knows_tools(tokenizer):
            fmt = detect_format(template, model)
        else:
            fmt = tool_format("hermes")  # dynask's default format was rendered
    sampling: dict[str, Any] = {}
    if fmt is not None and fmt.needs_special_tokens:
        sampling["skip_special_tokens"] = False
    opens = reasoning and prompt_opens_block(text)
    grammar = None
    if tools is not None and fmt is not None and engines <= set(SERVING_ENGINES):
        grammar = tool_grammar(tools, fmt, reasoning, opens)
        problem = None if grammar is None else grammar_problem(grammar["kind"], grammar["spec"])
        if problem is not None:
            raise invalid("tools", f"'tools': a function's parameters schema: {problem}")
        if tools.forced and grammar is not None:
            sampling["structured_output"] = grammar
    return text, ChatPlan(tools, fmt, reasoning, opens, sampling, grammar)
