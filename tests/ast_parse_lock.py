"""``ast.parse`` made safe for the test process's threads.

CPython 3.11 and 3.12 keep the AST constructor's recursion depth in interpreter-wide state
and reset it at the start of every ``ast.parse``. When one thread's parse is suspended
mid-construction by a garbage collection whose finalizer parses (a logged traceback does),
or whose finalizer lets the GIL pass to another thread that parses, the outer parse ends
with a count that is not the one it started from and raises ``SystemError: AST constructor
recursion depth mismatch`` (python/cpython gh-106905).

The test process has such threads: in-process servers and Dask's event loops format
tracebacks (``traceback`` parses source segments to place its carets), while the test's own
thread parses too — pytest rewrites modules imported late, Hypothesis reads lambdas' source.
CI lost the OpenAPI fuzz test to this twice. Every caller that parses through ``ast.parse``
or ``ast.literal_eval`` now goes through ``_guarded_parse``:

- One lock around the parse (re-entrant: a finalizer may parse inside a parse) makes the
  interleaving impossible between them. A parse waits at most ``LOCK_WAIT_S`` for it and
  then parses unlocked: a thread that holds a logging handler's lock while it formats a
  traceback must not wait forever on a parse whose finalizer logs to that handler.
- A parse that still ends in that one ``SystemError`` (a finalizer parsed inside it, in
  the same thread: the lock is re-entrant) is parsed again (parsing has no
  side effects), up to ``ATTEMPTS`` times; any other error is the caller's.
"""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Callable
from typing import Any

LOCK_WAIT_S = 1.0
ATTEMPTS = 5
MISMATCH = "AST constructor recursion depth mismatch"

_LOCK = threading.RLock()
_UNGUARDED_PARSE = ast.parse


def parse_guarded(parse: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``parse(*args, **kwargs)`` under the lock, again while it ends in the mismatch."""
    for attempt in range(1, ATTEMPTS + 1):
        locked = _LOCK.acquire(timeout=LOCK_WAIT_S)
        try:
            return parse(*args, **kwargs)
        except SystemError as exc:
            if MISMATCH not in str(exc) or attempt == ATTEMPTS:
                raise
        finally:
            if locked:
                _LOCK.release()
    raise AssertionError("unreachable")  # the last attempt returned or raised


@functools.wraps(_UNGUARDED_PARSE)
def _guarded_parse(*args: Any, **kwargs: Any) -> Any:
    return parse_guarded(_UNGUARDED_PARSE, *args, **kwargs)


def install() -> None:
    """Route ``ast.parse`` through the guard (idempotent)."""
    ast.parse = _guarded_parse  # type: ignore[assignment]
