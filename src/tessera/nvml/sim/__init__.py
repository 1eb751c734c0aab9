"""The NVML simulator: a fake ``libnvidia-ml`` installed where pynvml looks for the real one.

Only the bottom layer is simulated. :func:`install` puts a :class:`FakeNvmlLib` into
``pynvml.nvmlLib``, so the same :class:`tessera.nvml.backend.PynvmlBackend` code that runs on a
node runs in every test, through pynvml's own wrappers, structs and error classes.
"""

from __future__ import annotations

from typing import Any

import pynvml

from tessera.nvml.sim.fakelib import FakeNvmlLib
from tessera.nvml.sim.store import FileStore, MemoryStore, StateStore

__all__ = ["FakeNvmlLib", "FileStore", "MemoryStore", "install", "installed", "point_pynvml_at",
           "uninstall"]


def point_pynvml_at(lib: Any) -> None:
    """Make this process's pynvml call ``lib`` (a FakeNvmlLib, or a loaded library such as the
    simulated ``libnvidia-ml.so.1``); None: load the real library at the next ``nvmlInit``."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def install(store: StateStore) -> FakeNvmlLib:
    """Make every pynvml call in this process talk to the simulated node in ``store``."""
    lib = FakeNvmlLib(store)
    point_pynvml_at(lib)
    return lib


def installed() -> FakeNvmlLib | None:
    lib = pynvml.nvmlLib
    return lib if isinstance(lib, FakeNvmlLib) else None


def uninstall() -> None:
    """Forget the simulator, so the next ``nvmlInit`` loads the real library again."""
    point_pynvml_at(None)
