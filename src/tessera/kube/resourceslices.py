"""DRA objects on the API server: the node's ResourceSlices, and the ResourceClaims it prepares.

A node's pool is the node's name. It holds counter slices (each GPU's counter set, at most
eight sets a slice) and one device slice per GPU (its placements, at most 64 with counters).
The scheduler uses a pool only when it sees all ``resourceSliceCount`` slices of its newest
``generation``, so a change rewrites every slice under a new generation, and a pool that did
not change is not written at all: each slice carries a hash of what it was rendered from, and
equal hashes mean nothing to do (the API server adds defaults, such as a taint's
``timeAdded``, so comparing specs field by field would see changes that are not there).

The objects are plain dicts through the generic custom-objects client, as for NodePartitions,
so the Python client's models never drop a field the API has and the client does not know.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.core import dra
from tessera.core.catalogue import GpuModel
from tessera.core.layout import Slice

__all__ = [
    "ClaimDevice",
    "GpuPublication",
    "MpsPublication",
    "ResourceClaims",
    "ResourceSlices",
    "render_pool",
]

GROUP, VERSION = "resource.k8s.io", "v1"
HASH_ANNOTATION = f"{dra.DRIVER}/rendered-hash"
_MAX_COUNTER_SETS = 8
"""``ResourceSliceMaxCounterSets`` in k8s.io/api resource/v1."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuPublication:
    """What one MIG GPU publishes: its placements, minus what is held outside DRA, with
    taints."""

    index: int
    uuid: str
    model: GpuModel
    held: tuple[Slice, ...] = ()
    taints: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Device name -> (taint key, value) pairs, each ``NoSchedule``."""


@dataclass(frozen=True)
class MpsPublication:
    """A GPU without MIG shared through MPS: one device with ``shares`` of consumable capacity
    (each allocation takes one share unless the claim asks more), allocated many times over."""

    index: int
    uuid: str
    card: str
    memory_mib: int
    shares: int
    taints: tuple[tuple[str, str], ...] = ()


def _quantity(value: int) -> dict[str, str]:
    return {"value": str(value)}


def _tainted(body: dict[str, Any], taints: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``body`` with its (key, value) taints, each ``NoSchedule``, if it has any."""
    if taints:
        body["taints"] = [{"key": key, "value": value, "effect": "NoSchedule"}
                          for key, value in taints]
    return body


def _device(gpu: GpuPublication, offer: dra.DeviceOffer) -> dict[str, Any]:
    profile = offer.profile
    body: dict[str, Any] = {
        "name": offer.name,
        "attributes": {
            "mode": {"string": dra.MODE_MIG},
            "profile": {"string": profile.name},
            "model": {"string": gpu.model.name},
            "uuid": {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "start": {"int": offer.slice.start},
            "computeSlices": {"int": profile.compute_slices},
            "memorySlices": {"int": profile.memory_slices},
        },
        "capacity": {"memory": {"value": f"{profile.memory_mib}Mi"}},
        "consumesCounters": [{
            "counterSet": dra.counter_set_name(gpu.index),
            "counters": {k: _quantity(v)
                         for k, v in dra.consumption(gpu.model, offer.slice).items()},
        }],
    }
    return _tainted(body, gpu.taints.get(offer.name, ()))


def _mps_device(gpu: MpsPublication) -> dict[str, Any]:
    shares = str(gpu.shares)
    body: dict[str, Any] = {
        "name": dra.mps_device_name(gpu.index),
        "attributes": {"mode": {"string": dra.MODE_MPS}, "model": {"string": gpu.card},
                       "uuid": {"string": gpu.uuid}, "index": {"int": gpu.index},
                       "shareMemoryMiB": {"int": gpu.memory_mib // gpu.shares}},
        # Only the shares are consumable: an allocation that asks nothing of a capacity without
        # a request policy consumes all of it (fillEmptyRequest in k8s.io/dynamic-resource-
        # allocation), so a memory capacity here would let one pod take the whole device, as
        # the e2e test found. A share's memory is an attribute instead.
        "capacity": {
            dra.SHARES: {"value": shares, "requestPolicy": {
                "default": "1", "validRange": {"min": "1", "max": shares, "step": "1"}}},
        },
        "allowMultipleAllocations": True,
    }
    return _tainted(body, gpu.taints)


def render_pool(node: str, gpus: Sequence[GpuPublication],
                shared: Sequence[MpsPublication] = ()) -> dict[str, dict[str, Any]]:
    """Slice name -> spec (without ``pool.generation``) for the node's whole pool."""
    specs: dict[str, dict[str, Any]] = {}
    ordered = sorted(gpus, key=lambda g: g.index)
    for chunk in range(0, len(ordered), _MAX_COUNTER_SETS):
        sets = [{"name": dra.counter_set_name(gpu.index),
                 "counters": {k: _quantity(v)
                              for k, v in dra.capacities(gpu.model, gpu.held).items()}}
                for gpu in ordered[chunk:chunk + _MAX_COUNTER_SETS]]
        specs[f"{node}-{dra.DRIVER}-counters-{chunk // _MAX_COUNTER_SETS}"] = {
            "sharedCounters": sets}
    for gpu in ordered:
        specs[f"{node}-{dra.DRIVER}-gpu-{gpu.index}"] = {
            "devices": [_device(gpu, offer) for offer in dra.devices(gpu.model, gpu.index)]}
    for mps in sorted(shared, key=lambda g: g.index):
        specs[f"{node}-{dra.DRIVER}-gpu-{mps.index}"] = {"devices": [_mps_device(mps)]}
    for spec in specs.values():
        spec.update({"driver": dra.DRIVER, "nodeName": node})
        spec["pool"] = {"name": node, "resourceSliceCount": len(specs)}
    return specs


def _hash(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


class ResourceSlices:
    """The node's pool on the API server.

    At rest a sync costs nothing: what was last written is remembered (by hash), and the pool
    is listed again only when the node wants something else, or every ``verify_every`` syncs
    (someone else may have changed it: the kubelet deletes a driver's slices when the driver
    stays unregistered), so an agent's resync does not turn into a LIST per node every few
    seconds across a large cluster.
    """

    def __init__(self, api: client.ApiClient, *, verify_every: int = 6) -> None:
        self._api = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self.verify_every = verify_every
        self._written: dict[str, dict[str, str]] = {}
        self._since_verify: dict[str, int] = {}
        self.writes = 0
        """Slices created, replaced or deleted (the scale tests watch it stay flat at rest)."""
        self.lists = 0
        """Pool LISTs made (at rest: one per ``verify_every`` syncs)."""

    def list_pool(self, node: str) -> list[dict[str, Any]]:
        raw = cast(dict[str, Any], self._api.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices",
            field_selector=f"spec.nodeName={node},spec.driver={dra.DRIVER}"))
        return list(raw.get("items", []))

    def sync(self, node: str, specs: Mapping[str, dict[str, Any]]) -> bool:
        """Make the pool exactly ``specs``; True if anything was written."""
        hashes = {name: _hash(spec) for name, spec in specs.items()}
        count = self._since_verify.get(node, 0)
        if self._written.get(node) == hashes and count + 1 < self.verify_every:
            self._since_verify[node] = count + 1
            return False
        self._since_verify[node] = 0
        self._written.pop(node, None)  # until this sync has made it so
        existing = {item["metadata"]["name"]: item for item in self.list_pool(node)}
        self.lists += 1
        generations = {int(item["spec"]["pool"].get("generation", 0))
                       for item in existing.values()}
        unchanged = (set(existing) == set(specs) and len(generations) == 1 and all(
            item["metadata"].get("annotations", {}).get(HASH_ANNOTATION) == hashes[name]
            for name, item in existing.items()))
        if unchanged:
            self._written[node] = hashes
            return False
        generation = max(generations, default=0) + 1
        owner = self._owner(node)
        for name, spec in specs.items():
            body: dict[str, Any] = {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceSlice",
                "metadata": {"name": name, "annotations": {HASH_ANNOTATION: hashes[name]},
                             "ownerReferences": owner},
                "spec": {**spec, "pool": {**spec["pool"], "generation": generation}},
            }
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"][
                    "resourceVersion"]
                self._api.replace_cluster_custom_object(GROUP, VERSION, "resourceslices",
                                                        name, body)
            else:
                self._api.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
            self.writes += 1
        for name in set(existing) - set(specs):
            self._delete(name)
        self._written[node] = hashes
        log.info("published pool %s generation %d (%d slices)", node, generation, len(specs))
        return True

    def _delete(self, name: str) -> None:
        try:
            self._api.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
            self.writes += 1
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _owner(self, node: str) -> list[dict[str, Any]]:
        """The Node owns its slices, so deleting the node lets the garbage collector remove
        them even if no agent is left to do it."""
        try:
            found = self._core.read_node(node)
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise
        uid = found.metadata.uid if found.metadata else None
        return [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
                 "controller": True}] if uid else []


@dataclass(frozen=True)
class ClaimDevice:
    """One allocated device of a claim (``status.allocation.devices.results[]``)."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    """Set when the device is allocated many times over (consumable capacity)."""
    shares: int = 1
    """The ``shares`` capacity this allocation consumes (MPS devices)."""


class ResourceClaims:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = client.CustomObjectsApi(api)

    def allocated(self, namespace: str, name: str, uid: str) -> list[ClaimDevice] | None:
        """The claim's allocated devices; None if the claim is gone or is another object
        under the same name (its uid differs: the kubelet asked about one that was deleted)."""
        try:
            raw = cast(dict[str, Any], self._api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if raw.get("metadata", {}).get("uid") != uid:
            return None
        results = (raw.get("status", {}).get("allocation", {}).get("devices", {})
                   .get("results", []))
        return [ClaimDevice(r.get("request", ""), r.get("driver", ""), r.get("pool", ""),
                            r.get("device", ""), r.get("shareID"), _shares(r))
                for r in results]


def _shares(result: Mapping[str, Any]) -> int:
    """Shares an allocation consumes: ``consumedCapacity`` names it by the capacity's name,
    qualified with the driver's domain or not."""
    consumed = result.get("consumedCapacity") or {}
    value = consumed.get(dra.SHARES, consumed.get(f"{dra.DRIVER}/{dra.SHARES}", "1"))
    try:
        return max(1, int(str(value)))
    except ValueError:
        return 1
