"""The tool-call parsers, each format: exact calls whole and streamed in every split.

Every case is fed whole, one character at a time and in 3-character pieces: the content,
the calls and the concatenated argument pieces must be the same, and each call's id and
name must come in its first piece.
"""

from __future__ import annotations

import json

import pytest

from dynask.control_plane.api.tools.formats import detect_format, tool_format
from dynask.control_plane.api.tools.tool_stream import ForcedCallStream, ToolCallDelta, ToolStream

Result = tuple[str, list[tuple[str, str]]]


def _stream(stream: ToolStream | ForcedCallStream, text: str, step: int) -> Result:
    content, pieces = "", []
    for start in range(0, len(text), step):
        delta = stream.feed(text[start : start + step])
        content, pieces = content + delta.content, pieces + delta.tool_calls
    rest = stream.finish()
    content, pieces = content + rest.content, pieces + rest.tool_calls
    return content, _assembled(pieces, stream)


def _assembled(
    pieces: list[ToolCallDelta], stream: ToolStream | ForcedCallStream
) -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for piece in pieces:
        if piece.index not in calls:
            assert piece.id is not None and piece.id.startswith("call_") and piece.name
            names[piece.index], calls[piece.index] = piece.name, []
        else:
            assert piece.id is None and piece.name is None
        calls[piece.index].append(piece.arguments)
    streamed = [(names[i], "".join(calls[i])) for i in sorted(calls)]
    assert streamed == [(c.name, c.arguments) for c in stream.calls]
    return streamed


CASES = [
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 3}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
        "Let me check.",
        [("get_weather", '{"city": "Paris", "days": 3}'), ("now", "{}")],
    ),
    (
        "hermes",
        '<tool_call>{"arguments": {"q": "a \\"}\\" b"}, "name": "search"}</tool_call>',
        "",
        [("search", '{"q": "a \\"}\\" b"}')],
    ),
    ("hermes", "A <b>tag</b> and < sign", "A <b>tag</b> and < sign", []),
    ("hermes", "Text <tool_call> not json", "Text <tool_call> not json", []),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": [1, {"b": "}"}]}}; {"name": "g", "parameters": {}}',
        "",
        [("f", '{"a": [1, {"b": "}"}]}'), ("g", "{}")],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"x": 1}}',
        "",
        [("f", '{"x": 1}')],
    ),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"x": "y"}}, {"name": "g", "arguments": {}}]',
        "",
        [("f", '{"x": "y"}'), ("g", "{}")],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}',
        "Sure.",
        [("f", '{"x": 1}'), ("g", "{}")],
    ),
    (
        "pythonic",
        '[get_weather(city="Paris", days=3), now()]',
        "",
        [("get_weather", '{"city": "Paris", "days": 3}'), ("now", "{}")],
    ),
    ("pythonic", "[1, 2] is a list", "[1, 2] is a list", []),
]


@pytest.mark.parametrize("step", [1, 3, 10_000])
@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_each_format_whole_and_split(
    fmt: str, text: str, content: str, calls: list[tuple[str, str]], step: int
) -> None:
    assert _stream(ToolStream(tool_format(fmt)), text, step) == (content, calls)


def test_arguments_stream_before_the_call_is_complete() -> None:
    stream = ToolStream(tool_format("hermes"))
    first = stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert [(p.index, p.name, p.arguments) for p in first.tool_calls] == [
        (0, "get_weather", '{"ci')
    ]
    second = stream.feed('ty": "Par')
    assert [(p.id, p.arguments) for p in second.tool_calls] == [(None, 'ty": "Par')]
    assert stream.feed("is").tool_calls[0].arguments == "is"


def test_not_parallel_keeps_the_first_call() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"}</tool_call>'
    )
    assert _stream(ToolStream(tool_format("hermes"), parallel=False), text, 1) == (
        "",
        [("a", "{}")],
    )


@pytest.mark.parametrize("step", [1, 4])
def test_forced_named_reads_bare_arguments_or_markup(step: int) -> None:
    bare = _stream(ForcedCallStream("f", tool_format("hermes"), True), ' {"x": [1, 2]}', step)
    assert bare == ("", [("f", '{"x": [1, 2]}')])
    markup = '<tool_call>{"name": "f", "arguments": {"x": 2}}</tool_call>'
    assert _stream(ForcedCallStream("f", tool_format("hermes"), True), markup, step) == (
        "",
        [("f", '{"x": 2}')],
    )


def test_forced_required_reads_the_grammar_array() -> None:
    text = '[{"name": "a", "parameters": {"k": "v"}}, {"name": "b", "parameters": {}}]'
    result = _stream(ForcedCallStream(None, tool_format("hermes"), True), text, 2)
    assert result == ("", [("a", '{"k": "v"}'), ("b", "{}")])
    assert [json.loads(args) for _, args in result[1]] == [{"k": "v"}, {}]


def test_format_detection_from_the_template() -> None:
    assert detect_format("{{ '<tool_call>' }}", "qwen").name == "hermes"
    assert detect_format("[TOOL_CALLS] {{ tools }}", "mistral").name == "mistral"
    assert detect_format("Environment: ipython {{ tools }}", "llama").name == "llama3_json"
    assert detect_format("{{ tools }}", "some-pythonic-model").name == "pythonic"
    assert detect_format(None, "x").name == "hermes"


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="tool-call parser 'xml' is not known; valid: hermes"):
        tool_format("xml")
