"""Shared fixtures. The NVML simulator is process-global (it sits in ``pynvml.nvmlLib``), so
every fixture that installs it also removes it, and no test sees another's node. The root
logger is process-global too, so every test gets back the one it started with."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tessera.nvml import sim
from tessera.nvml.backend import PynvmlBackend
from tessera.nvml.sim.server import NvmlServer
from tessera.nvml.sim.state import NodeState, new_node_state
from tessera.nvml.sim.store import MemoryStore, StateStore, write_new_state_file
from tessera.testing import nvml_library, short_socket_dir
from tessera.testing.cluster.fixtures import require_nvml_library

SimNode = Callable[..., tuple[StateStore, PynvmlBackend]]


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A CLI run in-process (``tessera.cli.logs.configure``) points the root logger at the
    ``sys.stderr`` pytest captured for that test; left there, every later log line (the
    hollow nodes' agents log in-process) fails on the closed stream and prints a traceback
    that buries the failure CI shows."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture
def sim_node(tmp_path: Path) -> Iterator[SimNode]:
    """Start a simulated node: ``sim_node("A100-SXM4-40GB", mig=True, file=False)``.

    ``door="library"`` reaches it as a node reaches its driver: pynvml loads the simulated
    ``libnvidia-ml.so.1``, which forwards each call to :mod:`tessera.nvml.sim.server` over a
    socket (the state is then in a file, which the returned store also reads and changes)."""
    backends: list[PynvmlBackend] = []
    servers = contextlib.ExitStack()

    def start(*models: str, mig: bool = True, file: bool = False,
              state: NodeState | None = None,
              door: str = "in-process") -> tuple[StateStore, PynvmlBackend]:
        node_state = state or new_node_state("test-node", list(models), mig=mig)
        store: StateStore
        if file or door == "library":
            path = tmp_path / "node.json"
            write_new_state_file(path, node_state)
            store = sim.FileStore(path)
        else:
            store = MemoryStore(node_state)
        if door == "library":
            require_nvml_library()
            socket = servers.enter_context(short_socket_dir()) / "nvml.sock"
            servers.enter_context(NvmlServer(path, socket))
            nvml_library.load(socket)
        else:
            sim.install(store)
        backend = PynvmlBackend()
        backends.append(backend)
        return store, backend

    yield start
    for backend in backends:
        backend.close()
    sim.uninstall()
    servers.close()
