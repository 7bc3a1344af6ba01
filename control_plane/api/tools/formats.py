"""The tool-call formats open models write, each read into call snapshots.

A format says how a tool-call region opens (a marker anywhere in the output, or a
character the output must start with) and reads the region's text, complete or still
growing, into ``CallSnapshot``s. The formats:

- ``hermes`` (Hermes, Qwen2.5/Qwen3, and dynask's default for templates without tools):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call.
- ``llama3_json`` (Llama 3.1/3.2): ``{"name": ..., "parameters": {...}}`` at the start of
  the output (or after ``<|python_tag|>``), several separated by ``;``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, or the newer
  ``[TOOL_CALLS]name[ARGS]{...}``.
- ``pythonic`` (Llama 3.2/4 pythonic, some agents' models): ``[f(a=1), g(b="x")]``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from dynask.control_plane.api.tools.json_scan import scan_members, skip_whitespace, value_end


@dataclass(frozen=True)
class CallSnapshot:
    """What the text shows so far of one call: its name once complete, and a prefix of its
    arguments' JSON text that will not change (later text only extends it)."""

    name: str | None
    arguments: str
    complete: bool


@dataclass(frozen=True)
class ToolFormat:
    name: str
    markers: tuple[str, ...]  # a region opens at any of these, anywhere in the output
    leading: str  # or: the output (after whitespace) starts with this character ("": never)
    read: Callable[[str], list[CallSnapshot]]  # the region's text -> its calls so far
    looks_like_call: Callable[[str], bool | None] = lambda _: True  # for ``leading`` only
    needs_special_tokens: bool = False  # its markers are special tokens: keep them in text


def object_call(text: str, at: int) -> tuple[CallSnapshot, int | None]:
    """The call written as the JSON object at ``text[at]`` and where the object ends."""
    scan = scan_members(text, at)
    name = None
    name_member = scan.member("name")
    if name_member is not None and name_member.end is not None:
        value = _loads(text[name_member.start : name_member.end])
        name = value if isinstance(value, str) else None
    arguments = ""
    args = scan.member("arguments", "parameters")
    if args is None:
        arguments = "{}" if scan.end is not None else ""
    elif text[args.start] == '"':  # arguments sent as a JSON string of JSON
        if args.end is not None:
            inner = _loads(text[args.start : args.end])
            arguments = inner if isinstance(inner, str) else ""
    else:
        arguments = text[args.start : args.end if args.end is not None else len(text)]
    return CallSnapshot(name, arguments, scan.end is not None), scan.end


def object_sequence(text: str) -> list[CallSnapshot]:
    """Calls as JSON objects one after another, between any of ``[ , ; ]`` and tags."""
    calls: list[CallSnapshot] = []
    i = 0
    while i < len(text):
        brace = text.find("{", i)
        if brace < 0:
            break
        call, end = object_call(text, brace)
        calls.append(call)
        if end is None:
            break
        i = end
    return calls


def _hermes(region: str) -> list[CallSnapshot]:
    calls: list[CallSnapshot] = []
    for block in region.split("<tool_call>")[1:]:
        start = skip_whitespace(block, 0)
        if start < len(block) and block[start] == "{":
            calls.append(object_call(block, start)[0])
    return calls


def _llama3(region: str) -> list[CallSnapshot]:
    return object_sequence(region.removeprefix("<|python_tag|>"))


def _llama3_looks_like_call(region: str) -> bool | None:
    scan = scan_members(region, 0)
    if scan.members:
        return scan.members[0].key in ("name", "type", "function")
    rest = region[1:].lstrip()
    if not rest:
        return None
    if rest[0] != '"':
        return False
    key_end = rest.find('"', 1)
    return None if key_end < 0 else rest[1:key_end] in ("name", "type", "function")


_ARGS_FORM = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]")


def _mistral(region: str) -> list[CallSnapshot]:
    if "[ARGS]" not in region:
        return object_sequence(region.removeprefix("[TOOL_CALLS]"))
    calls: list[CallSnapshot] = []
    matches = list(_ARGS_FORM.finditer(region))
    for number, match in enumerate(matches):
        stop = matches[number + 1].start() if number + 1 < len(matches) else len(region)
        start = skip_whitespace(region, match.end())
        end = value_end(region[:stop], start) if start < stop else None
        arguments = region[start : end if end is not None else stop]
        calls.append(CallSnapshot(match.group(1), arguments.rstrip(), end is not None))
    return calls


_PY_CALL_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PY_MAYBE = re.compile(r"\[\s*([A-Za-z_][\w.]*\s*)?$")


def _pythonic_looks_like_call(region: str) -> bool | None:
    if _PY_CALL_START.match(region):
        return True
    return None if _PY_MAYBE.match(region) else False


def _pythonic(region: str) -> list[CallSnapshot]:
    """Complete calls only: a call is read once its closing parenthesis is written."""
    text = region.strip()
    end = _last_closed_call(text)
    if end is None:
        return []
    try:
        tree = ast.parse(text[:end] + "]", mode="eval")
    except SyntaxError:
        return []
    if not isinstance(tree.body, ast.List):
        return []
    calls: list[CallSnapshot] = []
    for element in tree.body.elts:
        call = _python_call(element)
        if call is None:
            return calls
        calls.append(call)
    return calls


def _last_closed_call(text: str) -> int | None:
    depth, quote, last, i = 0, "", None, 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 1 and char == ")":
                last = i + 1
        i += 1
    return last


def _python_call(node: ast.expr) -> CallSnapshot | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = ast.unparse(node.func)
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        return None
    return CallSnapshot(name, json.dumps(arguments), True)


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", ("<tool_call>",), "", _hermes),
    "llama3_json": ToolFormat(
        "llama3_json", ("<|python_tag|>",), "{", _llama3, _llama3_looks_like_call, True
    ),
    "mistral": ToolFormat("mistral", ("[TOOL_CALLS]",), "", _mistral, needs_special_tokens=True),
    "pythonic": ToolFormat("pythonic", (), "[", _pythonic, _pythonic_looks_like_call),
}
# Aliases other servers use for the same formats (vLLM's names).
ALIASES = {"qwen": "hermes", "qwen3": "hermes", "llama3": "llama3_json", "llama": "llama3_json"}
REQUIRED_FORMAT = ToolFormat("required", (), "[", object_sequence)  # the grammar's own shape


def tool_format(name: str) -> ToolFormat:
    """The format called ``name`` (or an alias); ``ValueError`` naming the known ones."""
    found = FORMATS.get(ALIASES.get(name, name))
    if found is None:
        known = ", ".join([*FORMATS, *ALIASES])
        raise ValueError(f"tool-call parser '{name}' is not known; valid: {known}")
    return found


def detect_format(chat_template: str | None, model: str) -> ToolFormat:
    """The format the model's chat template teaches (Hermes when it teaches none)."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "<|python_tag|>" in template or "Environment: ipython" in template:
        return FORMATS["llama3_json"]
    if "pythonic" in model.lower():
        return FORMATS["pythonic"]
    return FORMATS["hermes"]
