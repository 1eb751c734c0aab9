"""The NVML simulator: a fake ``libnvidia-ml`` installed where pynvml looks for the real one.

Only the bottom layer is simulated. :func:`install` puts a :class:`FakeNvmlLib` into
``pynvml.nvmlLib``, so the same :class:`tessera.nvml.backend.PynvmlBackend` code that runs on a
node runs in every test, through pynvml's own wrappers, structs and error classes.
"""

from __future__ import annotations

import pynvml

from tessera.nvml.sim.fakelib import FakeNvmlLib
from tessera.nvml.sim.store import FileStore, MemoryStore, StateStore

__all__ = ["FakeNvmlLib", "FileStore", "MemoryStore", "install", "installed", "uninstall"]


def install(store: StateStore) -> FakeNvmlLib:
    """Make every pynvml call in this process talk to the simulated node in ``store``."""
    lib = FakeNvmlLib(store)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return lib


def installed() -> FakeNvmlLib | None:
    lib = pynvml.nvmlLib
    return lib if isinstance(lib, FakeNvmlLib) else None


def uninstall() -> None:
    """Forget the simulator, so the next ``nvmlInit`` loads the real library again."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
