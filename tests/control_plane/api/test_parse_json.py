"""``parse_json``: orjson's speed, ``json.loads``'s values and errors."""

from __future__ import annotations

import json
import math

import pytest

from dynask.control_plane.api.openai_routes import parse_json


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "prompt": [1, 2, 3], "temperature": 0.1, "stream": true}',
        b'{"a": 1, "a": 2}',  # the last of duplicate keys, as json keeps it
        b'{"x": 1e308, "y": -0.0, "z": 0.30000000000000004, "big": 18446744073709551615}',
        b'{"t": "caf\\u00e9 \\ud83d\\ude00", "n": null, "l": [[], {}]}',
        '{"t": "é"}'.encode(),
        b"[1, 2.5, -3]",
    ],
)
def test_bodies_both_parsers_accept_read_as_json_reads_them(body: bytes) -> None:
    parsed = parse_json(body)
    assert parsed == json.loads(body)
    assert json.dumps(parsed) == json.dumps(json.loads(body))  # types too: 1 is not 1.0


def test_what_orjson_refuses_json_decides() -> None:
    big = parse_json(b'{"big": [1, 123456789012345678901234567890], "n": -9223372036854775809}')
    assert big == {"big": [1, 123456789012345678901234567890], "n": -9223372036854775809}
    assert parse_json(b'{"f": [1e300, 1]}') == {"f": [1e300, 1]}
    assert math.isnan(parse_json(b'{"x": NaN}')["x"])
    assert parse_json(b'{"s": "\\ud800"}') == {"s": "\ud800"}  # a lone surrogate: a 400 later
    assert parse_json('{"u": 1}'.encode("utf-16")) == {"u": 1}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"a": ', json.JSONDecodeError),
        (b"\xff{}", UnicodeDecodeError),
        (b"", json.JSONDecodeError),
    ],
)
def test_bodies_neither_accepts_raise_json_s_error(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error) as raised:
        parse_json(body)
    with pytest.raises(error) as expected:
        json.loads(body)
    assert str(raised.value) == str(expected.value)
