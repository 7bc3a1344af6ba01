"""The test process's ``ast.parse`` survives parses inside parses (CPython gh-106905).

Three threads parse a large module while a fourth makes garbage whose finalizers run
Python code, so collections inside the AST constructor hand the GIL to another parser —
the interleaving that raised "AST constructor recursion depth mismatch" on CPython 3.11.7
without the guard (reproduced in every one of five runs of this workload in ~2 s).
"""

from __future__ import annotations

import ast
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import ast_parse_lock


class _Finalized:
    def __init__(self) -> None:
        self.cycle = self  # collected by the cyclic GC, which runs __del__ mid-allocation

    def __del__(self) -> None:
        sum(range(200))


def test_conftest_installed_the_lock() -> None:
    assert ast.parse is ast_parse_lock._guarded_parse
    assert ast.literal_eval("[1, {'a': 2}]") == [1, {"a": 2}]  # goes through it too


def test_parsing_from_many_threads_never_mismatches() -> None:
    source = Path(ast.__file__).read_text(encoding="utf-8")
    errors: list[str] = []
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for _ in range(50):
                _Finalized()
            time.sleep(0)

    def parse() -> None:
        for _ in range(40):
            try:
                tree = ast.parse(source)
            except SystemError as exc:
                errors.append(str(exc))
                return
            assert isinstance(tree, ast.Module)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        churner = threading.Thread(target=churn)
        churner.start()
        parsers = [threading.Thread(target=parse) for _ in range(3)]
        for thread in parsers:
            thread.start()
        for thread in parsers:
            thread.join()
        stop.set()
        churner.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


class _ParsesWhenCollected:
    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("x = [1, (2, {3: 4})]")


def test_a_finalizer_parsing_inside_a_parse_never_mismatches() -> None:
    # One thread is enough: a collection inside the AST constructor runs a finalizer that
    # parses (a logged traceback does), which resets the count under the outer parse
    # (without the guard 18 of these 20 parses raised on CPython 3.11.7).
    source = Path(ast.__file__).read_text(encoding="utf-8")
    for _ in range(20):
        for _ in range(2000):
            _ParsesWhenCollected()
        assert isinstance(ast.parse(source), ast.Module)


def test_a_mismatched_parse_is_parsed_again() -> None:
    calls: list[str] = []

    def flaky(source: str) -> ast.Module:
        calls.append(source)
        if len(calls) < 3:
            raise SystemError(f"{ast_parse_lock.MISMATCH} (before=18, after=11)")
        return ast_parse_lock._UNGUARDED_PARSE(source)

    tree = ast_parse_lock.parse_guarded(flaky, "x = 1")

    assert isinstance(tree, ast.Module) and calls == ["x = 1"] * 3


def test_other_errors_and_a_lasting_mismatch_reach_the_caller() -> None:
    calls: list[str] = []

    def broken(source: str) -> ast.Module:
        calls.append(source)
        raise SystemError(ast_parse_lock.MISMATCH if source == "m" else "something else")

    with pytest.raises(SystemError, match="something else"):
        ast_parse_lock.parse_guarded(broken, "other")
    with pytest.raises(SystemError, match=ast_parse_lock.MISMATCH):
        ast_parse_lock.parse_guarded(broken, "m")
    assert calls == ["other"] + ["m"] * ast_parse_lock.ATTEMPTS
    with pytest.raises(SyntaxError):
        ast.parse("1 +")  # the real parser's errors pass through untouched
