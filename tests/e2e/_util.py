"""Small helpers shared by the e2e tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], timeout: float, what: str,
               interval: float = 0.2) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the last
    value seen. The cluster is asynchronous everywhere, so every check waits this way."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
