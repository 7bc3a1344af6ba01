"""``ast.parse`` serialized across the test process's threads.

CPython 3.11 and 3.12 keep the AST constructor's recursion depth in interpreter-wide state
and reset it at the start of every ``ast.parse``. When one thread's parse is suspended
mid-construction (a garbage collection runs a finalizer, the GIL passes) and another thread
parses, the first one ends with a count that is not the one it started from and raises
``SystemError: AST constructor recursion depth mismatch`` (python/cpython gh-106905).

The test process has such threads: in-process servers and Dask's event loops format
tracebacks (``traceback`` parses source segments to place its carets), while the test's own
thread parses too — pytest rewrites modules imported late, Hypothesis reads lambdas' source.
CI lost the OpenAPI fuzz test to this twice. One lock around ``ast.parse`` (re-entrant: a
finalizer may parse inside a parse) makes the interleaving impossible; every caller that
parses through ``ast.parse`` or ``ast.literal_eval`` goes through it.
"""

from __future__ import annotations

import ast
import functools
import threading
from typing import Any

_LOCK = threading.RLock()
_UNLOCKED_PARSE = ast.parse


@functools.wraps(_UNLOCKED_PARSE)
def _locked_parse(*args: Any, **kwargs: Any) -> Any:
    with _LOCK:
        return _UNLOCKED_PARSE(*args, **kwargs)


def install() -> None:
    """Route ``ast.parse`` through the lock (idempotent)."""
    ast.parse = _locked_parse  # type: ignore[assignment]
