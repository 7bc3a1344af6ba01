"""Reading a model's output, delta by delta, into content and OpenAI tool-call deltas.

Design decisions:
- Content is sent as it arrives, except text that could be the start of a tool-call
  marker (``<tool_`` …), held until the next delta says which it is. Markup never
  reaches the client as content.
- Once a region opens, every delta re-reads the region (``ToolFormat.read``) and sends
  what is new: a call's id and name first, as soon as the name is complete, then its
  arguments' raw JSON text as it grows. Re-reading is linear in the region's length and
  a region is a few hundred characters, so it costs less than keeping a parser's state.
- A region that never yields a call (the model wrote ``<tool_call>`` and then prose) is
  sent as content at the end, as if there were no tools: nothing the model wrote is lost.
- Text after the last call is dropped (what other servers do): it is markup's tail.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from dynask.control_plane.api.tools.formats import REQUIRED_FORMAT, CallSnapshot, ToolFormat


@dataclass(frozen=True)
class ToolCallDelta:
    """One piece of a streamed call: ``id`` and ``name`` come once, with its first piece."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class ParsedDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolStream:
    """One choice's output through one tool-call format."""

    def __init__(self, fmt: ToolFormat, parallel: bool = True) -> None:
        self.format = fmt
        self.parallel = parallel  # False: only the first call is kept
        self._held = ""  # text not sent yet (a possible marker, or an undecided start)
        self._region: str | None = None
        self._space_before = ""
        self._at_start = True
        self._sent: list[ToolCall] = []  # id, name and the arguments sent so far

    @property
    def calls(self) -> list[ToolCall]:
        return list(self._sent)

    def feed(self, text: str) -> ParsedDelta:
        if self._region is not None:
            self._region += text
            return ParsedDelta(tool_calls=self._new_pieces(final=False))
        self._held += text
        return self._scan_content()

    def finish(self) -> ParsedDelta:
        """What is left at the end of the output."""
        if self._region is None:
            held, self._held = self._held, ""
            return ParsedDelta(content=held)
        pieces = self._new_pieces(final=True)
        if not self._sent:  # the region held no call: it was content after all
            region, self._region = self._region, None
            return ParsedDelta(content=self._space_before + region)
        return ParsedDelta(tool_calls=pieces)

    def _scan_content(self) -> ParsedDelta:
        fmt, held = self.format, self._held
        if self._at_start and fmt.leading:
            stripped = held.lstrip()
            if not stripped:
                return ParsedDelta()  # only whitespace so far: it may precede a call
            if stripped[0] == fmt.leading:
                decided = fmt.looks_like_call(stripped)
                if decided is None:
                    return ParsedDelta()
                if decided:
                    self._held, self._at_start = "", False
                    return self._open(stripped, content="")
            self._at_start = False
        for marker in fmt.markers:
            at = held.find(marker)
            if at >= 0:
                self._held = ""
                return self._open(held[at:], content=held[:at])
        # Held: a possible marker's start, and the whitespace before it (content written
        # before a call ends without it, however the deltas fall).
        keep = _marker_prefix_length(held, fmt.markers)
        content = held[: len(held) - keep]
        keep += len(content) - len(content.rstrip())
        self._held = held[len(held) - keep :] if keep else ""
        return ParsedDelta(content=held[: len(held) - keep])

    def _open(self, region: str, content: str) -> ParsedDelta:
        self._region = region
        kept = content.rstrip()
        self._space_before = content[len(kept) :]  # given back if the region holds no call
        return ParsedDelta(content=kept, tool_calls=self._new_pieces(final=False))

    def _new_pieces(self, final: bool) -> list[ToolCallDelta]:
        assert self._region is not None
        snapshots = self.format.read(self._region)
        if not self.parallel:
            snapshots = snapshots[:1]
        pieces: list[ToolCallDelta] = []
        for index, snap in enumerate(snapshots):
            piece = self._advance(index, snap, final)
            if piece is not None:
                pieces.append(piece)
        return pieces

    def _advance(self, index: int, snap: CallSnapshot, final: bool) -> ToolCallDelta | None:
        if snap.name is None:
            return None
        arguments = snap.arguments.strip() if final or snap.complete else snap.arguments
        if index == len(self._sent):
            call = ToolCall(new_call_id(), snap.name, arguments)
            self._sent.append(call)
            return ToolCallDelta(index, call.id, call.name, arguments)
        sent = self._sent[index]
        if len(arguments) <= len(sent.arguments) or not arguments.startswith(sent.arguments):
            return None
        self._sent[index] = ToolCall(sent.id, sent.name, arguments)
        return ToolCallDelta(index, arguments=arguments[len(sent.arguments) :])


def _marker_prefix_length(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins one of ``markers``."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[-size:]):
                best = size
                break
    return best


class NamedCallStream:
    """``tool_choice`` naming a function: the whole output is that call's arguments (the
    grammar holds it to the function's parameters schema)."""

    def __init__(self, name: str) -> None:
        self._call = ToolCall(new_call_id(), name, "")
        self._started = False

    @property
    def calls(self) -> list[ToolCall]:
        return [self._call]

    def feed(self, text: str) -> ParsedDelta:
        arguments = (self._call.arguments + text).lstrip()
        new = arguments[len(self._call.arguments) :]
        self._call = ToolCall(self._call.id, self._call.name, arguments)
        if not self._started:
            self._started = True
            return ParsedDelta(tool_calls=[ToolCallDelta(0, self._call.id, self._call.name, new)])
        return ParsedDelta(tool_calls=[ToolCallDelta(0, arguments=new)] if new else [])

    def finish(self) -> ParsedDelta:
        if not self._started:  # an empty output still names the call
            return self.feed("")
        stripped = self._call.arguments.rstrip()
        self._call = ToolCall(self._call.id, self._call.name, stripped)
        return ParsedDelta()


class ForcedCallStream:
    """``tool_choice`` ``required`` or a named function. The grammar holds the output to
    bare JSON (the named function's arguments, or an array of calls); an engine without
    the grammar may write the model's own markup instead, which is read as under
    ``auto``. The first character that is not whitespace says which."""

    def __init__(self, named: str | None, native: ToolFormat, parallel: bool) -> None:
        self._named = named
        self._native = native
        self._parallel = parallel
        self._held = ""
        self._stream: ToolStream | NamedCallStream | None = None

    @property
    def calls(self) -> list[ToolCall]:
        return self._stream.calls if self._stream is not None else []

    def feed(self, text: str) -> ParsedDelta:
        if self._stream is None:
            self._held += text
            stripped = self._held.lstrip()
            if not stripped:
                return ParsedDelta()
            self._stream = self._choose(stripped[0])
            text, self._held = stripped, ""
        return self._stream.feed(text)

    def finish(self) -> ParsedDelta:
        if self._stream is None:
            self._stream = self._choose("{" if self._named else "[")
        return self._stream.finish()

    def _choose(self, first: str) -> ToolStream | NamedCallStream:
        if self._named is not None and first == "{":
            return NamedCallStream(self._named)
        if self._named is None and first == "[":
            return ToolStream(REQUIRED_FORMAT, self._parallel)
        return ToolStream(self._native, self._parallel)
