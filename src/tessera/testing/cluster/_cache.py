"""Where the Makefile caches a tool built from ``tools/``: one folder per version and content.

The Makefile names each build ``~/.cache/tessera/TOOL/VERSION-KEY``, KEY the first 12 hex
digits of the sha256 of its sources concatenated (``cat SOURCES | sha256sum | cut -c1-12``),
so every clone on a machine shares one build and a change to the sources makes a new one. The
tests find the same folder by the same rule, defined here once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["keyed_dir"]


def keyed_dir(root: Path, version: str, sources: Sequence[Path]) -> Path:
    """``root/VERSION-KEY`` for ``sources``, in the Makefile's order."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    return root / f"{version}-{digest}"
