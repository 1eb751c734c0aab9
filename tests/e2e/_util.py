"""Small helpers shared by the e2e tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], timeout: float, what: str,
               interval: float = 0.2, describe: Callable[[], object] | None = None) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the last
    value seen. The cluster is asynchronous everywhere, so every check waits this way.
    ``describe``: what else the failure should show (the objects the probe looked at)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            seen = f"; state: {describe()!r}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                 f"last: {last!r}{seen}")
        time.sleep(interval)


def selector(labels: Mapping[str, str]) -> str:
    """``labels`` as a label selector (``k=v,...``): a module names its pods' labels once."""
    return ",".join(f"{k}={v}" for k, v in labels.items())
