"""A simulated card outlives the process that changed it, and every process sees the same card.

This is what makes crash tests honest: a process killed at any instant leaves the file as it was
before or after one NVML call, never in between, and the next process finds that card.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.core import catalogue, layout
from tessera.nvml import sim
from tessera.nvml.backend import PynvmlBackend, open_backend
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import FileStore, load_state_file, write_new_state_file

CHILD = """
import sys
from tessera.nvml.backend import open_backend
backend = open_backend("sim:" + sys.argv[1])
created = backend.create_slice(0, "2g.10gb", 2)
print(created.uuid)
"""


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    write_new_state_file(path, new_node_state("shared", ["A100-SXM4-40GB"]))
    return path


def test_a_slice_made_by_one_process_is_seen_by_another_at_once(state_file: Path) -> None:
    backend = open_backend(f"sim:{state_file}")
    try:
        before = backend.create_slice(0, "3g.20gb", 4)
        child = subprocess.run([sys.executable, "-c", CHILD, str(state_file)], check=True,
                               capture_output=True, text=True, timeout=60)
        child_uuid = child.stdout.strip()
        seen = {i.uuid: (i.profile, i.start) for i in backend.gpu_instances(0)}
        assert seen == {before.uuid: ("3g.20gb", 4), child_uuid: ("2g.10gb", 2)}
        assert backend.processes(child_uuid) == []
    finally:
        backend.close()
        sim.uninstall()


def _churn(path: str, seed: int, ready: multiprocessing.synchronize.Event) -> None:
    """Create and destroy slices forever, the way an agent applying layouts would."""
    sim.install(FileStore(path))
    backend = PynvmlBackend()
    rng = random.Random(seed)
    model = catalogue.model("A100-SXM4-40GB")
    candidates = [layout.Slice(p.name, s) for p in model.profiles for s in p.starts]
    ready.set()
    while True:
        existing = backend.gpu_instances(0)
        if existing and rng.random() < 0.5:
            backend.destroy_slice(0, rng.choice(existing).id)
            continue
        current = [layout.Slice(i.profile, i.start) for i in existing]
        item = rng.choice(candidates)
        if layout.conflict_with(model, current, item) is None:
            backend.create_slice(0, item.profile, item.start)


def _check_card(path: Path) -> None:
    state = load_state_file(path)  # parses: the file is whole
    gpu = state.gpus[0]
    model = catalogue.model(gpu.model)
    slices = []
    for instance in gpu.instances:
        profile = model.profile_by_id(instance.profile_id)
        assert profile is not None
        assert instance.size == profile.memory_slices
        assert instance.id == model.gpu_instance_id(catalogue.Placement(instance.start,
                                                                        instance.size))
        assert len(instance.compute_instances) <= 1
        slices.append(layout.Slice(profile.name, instance.start))
    layout.check_layout(model, slices)
    uuids = [c.uuid for i in gpu.instances for c in i.compute_instances]
    assert len(uuids) == len(set(uuids))


def test_a_process_killed_at_any_instant_never_leaves_a_half_written_card(
    state_file: Path,
) -> None:
    context = multiprocessing.get_context("fork")
    rng = random.Random(20261202)
    serials = []
    for kill_point in range(200):
        ready = context.Event()
        child = context.Process(target=_churn, args=(str(state_file), kill_point, ready),
                                daemon=True)
        child.start()
        assert ready.wait(30), "the churning child never started"
        time.sleep(rng.uniform(0, 0.06))
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        _check_card(state_file)
        serials.append(json.loads(state_file.read_text())["serial"])
    assert serials[-1] >= 50, "the children created slices between the kills"
    assert serials == sorted(serials), "a later process never undoes an earlier one's call"
    leftovers = [p.name for p in state_file.parent.iterdir()
                 if p.name not in {"node.json", "node.json.lock"}]
    assert len(leftovers) <= 1  # at most the temporary file of the last kill, removed next write
    store = FileStore(state_file)
    with store.mutate():
        pass
    assert [p.name for p in state_file.parent.iterdir()
            if p.name not in {"node.json", "node.json.lock"}] == []
