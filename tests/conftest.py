"""Shared fixtures. The NVML simulator is process-global (it sits in ``pynvml.nvmlLib``), so
every fixture that installs it also removes it, and no test sees another's node."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tessera.nvml import sim
from tessera.nvml.backend import PynvmlBackend
from tessera.nvml.sim.state import NodeState, new_node_state
from tessera.nvml.sim.store import MemoryStore, StateStore, write_new_state_file

SimNode = Callable[..., tuple[StateStore, PynvmlBackend]]


@pytest.fixture
def sim_node(tmp_path: Path) -> Iterator[SimNode]:
    """Start a simulated node: ``sim_node("A100-SXM4-40GB", mig=True, file=False)``."""
    backends: list[PynvmlBackend] = []

    def start(*models: str, mig: bool = True, file: bool = False,
              state: NodeState | None = None) -> tuple[StateStore, PynvmlBackend]:
        node_state = state or new_node_state("test-node", list(models), mig=mig)
        store: StateStore
        if file:
            path = tmp_path / "node.json"
            write_new_state_file(path, node_state)
            store = sim.FileStore(path)
        else:
            store = MemoryStore(node_state)
        sim.install(store)
        backend = PynvmlBackend()
        backends.append(backend)
        return store, backend

    yield start
    for backend in backends:
        backend.close()
    sim.uninstall()
