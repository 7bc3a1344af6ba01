"""The command-line flags of the chat output parsers: tool calls and reasoning."""

from __future__ import annotations

import argparse

from dynask.control_plane.api.chat_output import ChatOptions
from dynask.control_plane.api.reasoning import PARSERS
from dynask.control_plane.api.tools.formats import ALIASES, FORMATS


def add_chat_args(cmd: argparse.ArgumentParser) -> None:
    group = cmd.add_argument_group("tool calls and reasoning (chat, Responses, Messages APIs)")
    group.add_argument(
        "--tool-call-parser",
        choices=[*FORMATS, *ALIASES],
        default=None,
        help="the format the model writes tool calls in (default: the one its chat "
        "template teaches; hermes for templates without tools)",
    )
    group.add_argument(
        "--reasoning-parser",
        choices=[*PARSERS, "none"],
        default=None,
        help="read <think>...</think> into reasoning_content (default: when the chat "
        "template knows <think>; none: never)",
    )


def chat_options(args: argparse.Namespace) -> ChatOptions:
    return ChatOptions(
        tool_call_parser=getattr(args, "tool_call_parser", None),
        reasoning_parser=getattr(args, "reasoning_parser", None),
    )
