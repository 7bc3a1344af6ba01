"""An incremental scan of JSON text that may still be growing (a model is writing it).

``scan_members`` finds the top-level members of an object and where each value's text
starts and ends; a value still being written has no end yet. The streaming parsers send a
tool call's arguments as the raw text of its ``arguments`` value, a prefix at a time: any
prefix of that text is final, so what was sent never has to be taken back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_OPEN = {"{": "}", "[": "]"}
_WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class Member:
    """One ``"key": value`` of an object: the value's text is ``text[start:end]``."""

    key: str
    start: int
    end: int | None  # None: the value is not complete yet


@dataclass(frozen=True)
class ObjectScan:
    members: tuple[Member, ...]
    end: int | None  # one past the object's closing brace; None: not closed yet

    def member(self, *keys: str) -> Member | None:
        return next((m for m in self.members if m.key in keys), None)


def skip_whitespace(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def string_end(text: str, at: int) -> int | None:
    """One past the closing quote of the JSON string that opens at ``text[at]``."""
    i = at + 1
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == '"':
            return i + 1
        i += 1
    return None


def value_end(text: str, at: int) -> int | None:
    """One past the JSON value that starts at ``text[at]``; None while it is incomplete."""
    if at >= len(text):
        return None
    first = text[at]
    if first == '"':
        return string_end(text, at)
    if first in _OPEN:
        return _container_end(text, at)
    i = at  # a number, true, false or null: ends at a delimiter
    while i < len(text) and text[i] not in ",}] \t\r\n":
        i += 1
    return i if i < len(text) else None


def _container_end(text: str, at: int) -> int | None:
    closers = [_OPEN[text[at]]]
    i = at + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            end = string_end(text, i)
            if end is None:
                return None
            i = end
            continue
        if char in _OPEN:
            closers.append(_OPEN[char])
        elif closers and char == closers[-1]:
            closers.pop()
            if not closers:
                return i + 1
        i += 1
    return None


def scan_members(text: str, at: int) -> ObjectScan:
    """The members of the object whose ``{`` is ``text[at]``, as far as the text goes."""
    members: list[Member] = []
    i = skip_whitespace(text, at + 1)
    while i < len(text):
        if text[i] == "}":
            return ObjectScan(tuple(members), i + 1)
        if text[i] == ",":
            i = skip_whitespace(text, i + 1)
            continue
        if text[i] != '"':
            break  # not JSON: stop here
        key_end = string_end(text, i)
        if key_end is None:
            break
        colon = skip_whitespace(text, key_end)
        if colon >= len(text) or text[colon] != ":":
            break
        start = skip_whitespace(text, colon + 1)
        if start >= len(text):
            break
        end = value_end(text, start)
        members.append(Member(_key(text[i:key_end]), start, end))
        if end is None:
            break
        i = skip_whitespace(text, end)
    return ObjectScan(tuple(members), None)


def _key(quoted: str) -> str:
    try:
        key = json.loads(quoted)
    except json.JSONDecodeError:
        return quoted.strip('"')
    return key if isinstance(key, str) else str(key)
