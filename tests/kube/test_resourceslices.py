"""The node's pool on the API server: written under a new generation when it changes, and at
rest neither written nor listed (but verified now and then). The API is faked at the level of
the generic custom-objects client; tests/e2e/test_dra.py runs it on the real API server."""

from __future__ import annotations

import copy
from typing import Any

from tessera.core import catalogue
from tessera.kube.resourceslices import GpuPublication, ResourceSlices, render_pool


class FakeObjects:
    """The ``CustomObjectsApi`` calls ResourceSlices makes, over a dict."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.version = 0

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.items[stored["metadata"]["name"]] = stored
        return stored

    def list_cluster_custom_object(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.calls.append("list")
        return {"items": copy.deepcopy(list(self.items.values()))}

    def create_cluster_custom_object(self, _g: str, _v: str, _p: str,
                                     body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        return self._store(body)

    def replace_cluster_custom_object(self, _g: str, _v: str, _p: str, _name: str,
                                      body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("replace")
        return self._store(body)

    def delete_cluster_custom_object(self, _g: str, _v: str, _p: str, name: str) -> None:
        self.calls.append("delete")
        del self.items[name]


def _slices(fake: FakeObjects) -> ResourceSlices:
    slices = ResourceSlices.__new__(ResourceSlices)
    ResourceSlices.__init__(slices, None, verify_every=3)  # type: ignore[arg-type]
    slices._api = fake  # type: ignore[assignment]
    slices._owner = lambda node: []  # type: ignore[method-assign]
    return slices


A100 = catalogue.model("A100-80GB")


def test_a_change_rewrites_every_slice_under_a_new_generation() -> None:
    fake = FakeObjects()
    slices = _slices(fake)
    assert slices.sync("n", render_pool("n", [GpuPublication(0, "GPU-0", A100)]))
    assert {i["spec"]["pool"]["generation"] for i in fake.items.values()} == {1}
    tainted = GpuPublication(0, "GPU-0", A100, taints={"gpu-0-7g80gb-at-0": (("k", "v"),)})
    assert slices.sync("n", render_pool("n", [tainted]))
    assert {i["spec"]["pool"]["generation"] for i in fake.items.values()} == {2}
    assert len(fake.items) == 2


def test_at_rest_nothing_is_written_and_the_pool_is_listed_only_to_verify() -> None:
    fake = FakeObjects()
    slices = _slices(fake)
    pool = render_pool("n", [GpuPublication(0, "GPU-0", A100)])
    slices.sync("n", pool)
    fake.calls.clear()
    assert [slices.sync("n", pool) for _ in range(6)] == [False] * 6
    assert fake.calls == ["list", "list"], "one LIST in verify_every (3) syncs, no writes"


def test_a_slice_deleted_behind_its_back_is_restored_at_the_next_verify() -> None:
    fake = FakeObjects()
    slices = _slices(fake)
    pool = render_pool("n", [GpuPublication(0, "GPU-0", A100)])
    slices.sync("n", pool)
    fake.items.clear()  # the kubelet wiped the driver's slices
    results = [slices.sync("n", pool) for _ in range(3)]
    assert results == [False, False, True]
    assert len(fake.items) == 2
