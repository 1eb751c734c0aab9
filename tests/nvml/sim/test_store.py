"""Node-state files: bad input is refused naming the file, field and fix; never rewritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.core.errors import StateFileError
from tessera.nvml import sim
from tessera.nvml.backend import PynvmlBackend
from tessera.nvml.sim.state import new_node_state
from tessera.nvml.sim.store import FileStore, load_state_file, write_new_state_file


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    write_new_state_file(path, new_node_state("node-a", ["A100-SXM4-40GB", "H100-80GB"]))
    return path


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="tessera dev sim init") as error:
        load_state_file(tmp_path / "absent.json")
    assert error.value.path.endswith("absent.json")


@pytest.mark.parametrize(
    ("document", "field", "problem"),
    [
        ("{not json", "(syntax)", "not valid JSON or YAML"),
        ("[1, 2]", "(top level)", "expected a mapping"),
        ('{"version": 1, "gpus": [{"index": 0, "model": "A200", "uuid": "GPU-x"}]}',
         "gpus[0].uuid", "should match pattern"),
        ('{"version": 1, "gpus": [{"index": 0, "model": "A200",'
         ' "uuid": "GPU-00000000-0000-0000-0000-000000000000"}]}',
         "gpus[0]", "unknown GPU model 'A200' (a catalogue name"),
        ('{"version": 1, "gpus": [], "colour": "red"}', "colour", "Extra inputs"),
        ('{"version": 9, "gpus": []}', "version", "newer than this tessera reads"),
    ],
)
def test_a_malformed_file_names_the_field_and_is_left_untouched(
    tmp_path: Path, document: str, field: str, problem: str
) -> None:
    path = tmp_path / "node.json"
    path.write_text(document)
    with pytest.raises(StateFileError) as error:
        FileStore(path)
    assert error.value.field.startswith(field)
    assert problem in str(error.value)
    assert path.read_text() == document


def test_hand_written_yaml_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    state = new_node_state("node-y", ["A30-24GB"])
    path.write_text(
        "version: 1\nnode: node-y\ngpus:\n"
        f"  - index: 0\n    model: A30-24GB\n    uuid: {state.gpus[0].uuid}\n    mig_current: 1\n"
    )
    assert load_state_file(path).gpus[0].model == "A30-24GB"


def test_every_change_is_in_the_file_when_the_call_returns(state_file: Path) -> None:
    sim.install(FileStore(state_file))
    backend = PynvmlBackend()
    try:
        created = backend.create_slice(0, "2g.10gb", 2)
        on_disk = json.loads(state_file.read_text())
        (instance,) = on_disk["gpus"][0]["instances"]
        assert (instance["id"], instance["start"]) == (created.id, 2)
        assert instance["compute_instances"][0]["uuid"] == created.uuid
        backend.destroy_slice(0, created.id)
        assert json.loads(state_file.read_text())["gpus"][0]["instances"] == []
    finally:
        backend.close()
        sim.uninstall()


def test_mig_uuids_differ_between_nodes_and_between_lifetimes(tmp_path: Path) -> None:
    uuids = []
    for node in ("node-a", "node-b"):
        sim.install(sim.MemoryStore(new_node_state(node, ["H100-80GB"])))
        backend = PynvmlBackend()
        try:
            first = backend.create_slice(0, "1g.10gb", 0)
            backend.destroy_slice(0, first.id)
            second = backend.create_slice(0, "1g.10gb", 0)
            uuids += [first.uuid, second.uuid]
        finally:
            backend.close()
            sim.uninstall()
    assert len(set(uuids)) == 4
