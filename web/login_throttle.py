"""Slowing down password guessing on the admin login.

Failed logins are counted per user name and per client address over a sliding window;
``max_failures`` of them lock that name or address out for ``lockout_s``, doubling with
each further lockout up to ``max_lockout_s``. While locked, even the right password is
refused (429 with ``Retry-After``), so a guesser learns nothing. A success clears the
name's and the address's counts. Both tables are bounded (oldest entries go first), so a
flood of made-up names cannot grow memory without limit.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Record:
    failures: deque[float] = field(default_factory=deque)
    locked_until: float = 0.0
    lockouts: int = 0


class LoginThrottle:
    def __init__(
        self,
        max_failures: int = 5,
        window_s: float = 900.0,
        lockout_s: float = 30.0,
        max_lockout_s: float = 900.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.lockout_s = lockout_s
        self.max_lockout_s = max_lockout_s
        self.max_entries = max_entries
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def retry_after(self, username: str, client: str) -> float:
        """Seconds until ``username`` may try again from ``client``; 0 if it may now."""
        now = self._clock()
        waits = [
            record.locked_until - now
            for key in _keys(username, client)
            if (record := self._records.get(key)) is not None
        ]
        return max([0.0, *waits])

    def failed(self, username: str, client: str) -> None:
        now = self._clock()
        for key in _keys(username, client):
            record = self._records.pop(key, None) or _Record()
            self._records[key] = record  # most recently used last
            while record.failures and record.failures[0] <= now - self.window_s:
                record.failures.popleft()
            record.failures.append(now)
            if len(record.failures) >= self.max_failures:
                lockout = self.lockout_s * 2**record.lockouts
                record.locked_until = now + min(lockout, self.max_lockout_s)
                record.lockouts += 1
                record.failures.clear()
        while len(self._records) > self.max_entries:
            self._records.popitem(last=False)

    def succeeded(self, username: str, client: str) -> None:
        for key in _keys(username, client):
            self._records.pop(key, None)


def _keys(username: str, client: str) -> tuple[str, str]:
    return f"user:{username.lower()}", f"client:{client}"
