"""What the components logged while a test ran, short enough to print with its failure.

An end-to-end failure is mostly a timeout ("waited 60 s for two pods running"): the reason is
in some component's log (a controller traceback, a kubelet admission refusal), and those logs
are deleted with the cluster when the session ends. CI keeps only pytest's output, so a failed
test carries this excerpt in its report: each log written to during the test, its problem
lines (Python's ERROR and tracebacks, klog's ``E`` lines) and, for Tessera's own components,
its last lines, bounded so the report stays readable.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["log_excerpts"]

_PROBLEM = re.compile(r"ERROR|CRITICAL|Traceback|Exception|Error:|^E\d{4} ")
"""Python's logging levels and tracebacks, klog's error lines (``E1205 09:05:05.70 ...``)."""

_OURS = ("controller", "agent")
"""Logs whose last lines are shown even without a problem line: what Tessera last did."""


def _ours(path: Path) -> bool:
    return path.name.startswith(_OURS)


def log_excerpts(root: Path, since: float, *, problems: int = 8, tail: int = 6,
                 width: int = 240, total: int = 160) -> str:
    """The excerpt of every ``*.log`` under ``root`` modified at or after ``since`` (epoch
    seconds): up to ``problems`` last problem lines each, and ``tail`` last lines of the
    controller's and agents' logs; lines cut at ``width`` characters, ``total`` lines in all
    (the rest counted, not shown); Tessera's logs first. Empty when nothing was written."""
    out: list[str] = []
    paths = sorted(root.rglob("*.log"), key=lambda p: (not _ours(p), str(p)))
    for path in paths:
        try:
            if path.stat().st_mtime < since:
                continue
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        found = [i for i, line in enumerate(lines) if _PROBLEM.search(line)]  # in order
        shown = set(found[-problems:]) if problems else set()
        if _ours(path):
            shown.update(range(max(0, len(lines) - tail), len(lines)))
        if shown:
            out.append(f"--- {path.relative_to(root)}")
            out.extend(lines[i][:width] for i in sorted(shown))
    if len(out) > total:
        out = [*out[:total], f"... {len(out) - total} more lines"]
    return "\n".join(out)
