"""The agent's DRA side: publish the node's MIG placements, and make the slice the scheduler chose.

On a DRA node nothing is partitioned ahead of time. The node's ResourceSlices offer every
placement of every GPU (:mod:`tessera.core.dra`); kube-scheduler allocates one to a claim; the
kubelet then calls ``NodePrepareResources`` and this driver creates that exact MIG slice and
hands back its CDI device id. ``NodeUnprepareResources`` destroys it again.

Crash safety, the same rule as every apply: the checkpoint (a JSON file beside the plugin
socket) records a claim *before* its slice is created, with the placement. A restart that finds
a claim recorded but not finished looks for the slice at that placement and adopts it, or
creates it; the kubelet repeats a prepare it did not get an answer to, and both calls then
give the same device. A slice on the card that no recorded claim owns (left by a crash before
the record, or made outside Tessera) is taken out of the published counters while it is in
use, and destroyed when it is free, so nothing leaks and nothing is offered twice.

Which devices are offered: all placements of all healthy GPUs; a GPU with a fatal Xid gets
every device tainted ``NoSchedule`` (``gpu.tessera.dev/unhealthy``); curation (the
controller's, through ``NodePartition.spec.dra.curated``) taints the placements it wants the
scheduler's first fit to skip. Taints are advisory: the counters alone decide what fits.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from tessera.agent.metrics import AgentMetrics
from tessera.agent.mps import MpsManager
from tessera.agent.node import NodeRuntime
from tessera.agent.observation import GpuObservation, NodeObservation, ObservedInstance
from tessera.agent.reconcile import StartMps, StopMps
from tessera.agent.reconciler import ReconcileResult, utc_now
from tessera.agent.status import dra_status
from tessera.api.v1alpha1 import MpsStatus, NodePartition
from tessera.core import catalogue, dra
from tessera.core.catalogue import GpuModel, WholeGpu
from tessera.core.errors import BackendError
from tessera.core.layout import Slice, conflict_with
from tessera.kube.resourceslices import ClaimDevice, GpuPublication, MpsPublication, render_pool
from tessera.kubelet.allocation import MPS_MEMORY_ENV, MPS_PIPE_ENV, MPS_THREADS_ENV
from tessera.kubelet.dra import ClaimRef, PreparedClaim, PreparedDevice
from tessera.nvml.backend import GpuBackend

__all__ = ["CDI_KIND", "ClaimSource", "DraDriver", "DraReconciler", "PoolWriter", "PrepareError"]

log = logging.getLogger(__name__)

CDI_KIND = f"{dra.DRIVER}/mig"
"""CDI ``vendor/class`` of the devices handed out: ids are ``gpu.tessera.dev/mig=<MIG uuid>``."""
CDI_MPS_KIND = f"{dra.DRIVER}/mps"
"""CDI kind of MPS shares: ``gpu.tessera.dev/mps=<GPU uuid>-<share id>``."""


class PrepareError(Exception):
    """A claim cannot be prepared or unprepared; the message goes back to the kubelet as is,
    and from there into the pod's events."""


class ClaimSource(Protocol):
    """Where the driver reads a claim's allocation (the API server; a dict in unit tests)."""

    def allocated(self, namespace: str, name: str, uid: str) -> list[ClaimDevice] | None: ...


class PoolWriter(Protocol):
    """Where the driver publishes the pool (ResourceSlices; a recorder in unit tests)."""

    def sync(self, node: str, specs: Mapping[str, dict[str, Any]]) -> bool: ...


@dataclass
class _Record:
    """One prepared device of a claim, as the checkpoint keeps it."""

    request: str
    device: str
    gpu_uuid: str
    gpu_index: int
    profile: str
    start: int
    mig_uuid: str | None = None
    kind: str = dra.MODE_MIG
    """``mig`` (a slice made for the claim) or ``mps`` (shares of the GPU's MPS daemon)."""
    shares: int = 1
    share_id: str | None = None

    @property
    def slice(self) -> Slice:
        return Slice(self.profile, self.start)


@dataclass
class _Claim:
    namespace: str
    name: str
    devices: list[_Record]
    ready: bool = False


def _health_taints(gpu: GpuObservation) -> tuple[tuple[str, str], ...]:
    """What every device of ``gpu`` carries while it is unhealthy (after a fatal Xid)."""
    return () if gpu.healthy else ((dra.TAINT_UNHEALTHY, f"xid-{gpu.last_xid or 0}"),)


class DraDriver:
    """Implements the kubelet plugin's ``ClaimPreparer`` and keeps the node's pool current."""

    def __init__(self, node: str, runtime: NodeRuntime, claims: ClaimSource, pool: PoolWriter,
                 state_dir: Path, *, cdi_dir: Path | None = None,
                 curated: Callable[[], Mapping[str, Iterable[str]]] = dict,
                 mps: MpsManager | None = None, mps_shares: int = 0,
                 keep_slices: bool = False, metrics: AgentMetrics | None = None) -> None:
        self.node = node
        self.runtime = runtime
        self.backend: GpuBackend = runtime.backend
        self.claims = claims
        self.pool = pool
        self.state_dir = state_dir
        self.cdi_dir = cdi_dir
        self.curated = curated
        """GPU UUID -> profiles to taint ``curated`` (read at every publish)."""
        self.mps = mps
        self.mps_shares = mps_shares if mps is not None else 0
        """Shares each GPU without MIG offers through MPS (0: such GPUs are not offered)."""
        self.metrics = metrics or AgentMetrics()
        self.keep_slices = keep_slices
        """Unprepare leaves the slice on the card, free (a pod of the same placement starts
        without a create); a prepare that needs its room destroys it first."""
        self._lock = threading.RLock()
        self._checkpoint = state_dir / "checkpoint.json"
        self._prepared: dict[str, _Claim] = self._load()
        self.changed: Callable[[], None] = lambda: None
        """Called after a prepare or unprepare changed the card (the runner republishes)."""

    # -- checkpoint ---------------------------------------------------------------------------

    def _load(self) -> dict[str, _Claim]:
        try:
            raw = json.loads(self._checkpoint.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return {uid: _Claim(c["namespace"], c["name"], [_Record(**d) for d in c["devices"]],
                            bool(c.get("ready")))
                for uid, c in raw.get("claims", {}).items()}

    def _save(self) -> None:
        """Write the checkpoint atomically (a crash leaves the old file or the new one)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        body = {"claims": {uid: {"namespace": c.namespace, "name": c.name, "ready": c.ready,
                                 "devices": [asdict(d) for d in c.devices]}
                           for uid, c in sorted(self._prepared.items())}}
        tmp = self._checkpoint.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self._checkpoint)

    def prepared_claims(self) -> dict[str, tuple[str, ...]]:
        """Claim uid -> device names, for status and tests."""
        with self._lock:
            return {uid: tuple(d.device for d in c.devices) for uid, c in self._prepared.items()}

    def slice_claims(self) -> dict[tuple[str, str, int], str]:
        """(GPU uuid, profile, start) -> ``namespace/name`` of the claim it was made for."""
        with self._lock:
            return {(d.gpu_uuid, d.profile, d.start): f"{c.namespace}/{c.name}"
                    for c in self._prepared.values() for d in c.devices}

    def _forget_abandoned(self) -> None:
        """A claim recorded but never finished (the agent died mid-prepare) whose claim is
        gone will never be prepared or unprepared again by the kubelet: undo it here."""
        for uid, entry in list(self._prepared.items()):
            if not entry.ready and self.claims.allocated(entry.namespace, entry.name,
                                                         uid) is None:
                log.info("claim %s/%s is gone mid-prepare; undoing it", entry.namespace,
                         entry.name)
                self._roll_back(uid)

    # -- what the node offers -----------------------------------------------------------------

    @staticmethod
    def _model(gpu: GpuObservation) -> GpuModel | None:
        if gpu.info.lost or not gpu.info.mig_current or gpu.info.model is None:
            return None
        return catalogue.find_model(gpu.info.model)

    def _owned(self) -> dict[tuple[str, Slice], str]:
        """(GPU uuid, slice) -> claim uid, for every recorded MIG device."""
        return {(d.gpu_uuid, d.slice): uid for uid, c in self._prepared.items()
                for d in c.devices if d.kind == dra.MODE_MIG}

    def _shareable(self, gpu: GpuObservation) -> WholeGpu | None:
        """The card, if this GPU is offered as MPS shares: no MIG, MPS-capable, MPS on."""
        info = gpu.info
        if self.mps_shares <= 0 or info.lost or info.mig_current:
            return None
        card = catalogue.find_card(info.name, info.pci_device_id or None)
        return card if isinstance(card, WholeGpu) and card.mps_supported else None

    def _mps_step(self, gpu: GpuObservation) -> StartMps:
        shares = self.mps_shares
        return StartMps(gpu.index, gpu.info.uuid, shares, max(1, 100 // shares),
                        gpu.info.memory_total_mib // shares)

    def mps_status(self) -> dict[str, MpsStatus]:
        """The MPS daemons of shared GPUs (Stopped: no claim has asked for a share yet)."""
        latest = self.runtime.latest
        if self.mps is None or latest is None:
            return {}
        running = self.mps.status()
        found: dict[str, MpsStatus] = {}
        for gpu in latest.gpus:
            if self._shareable(gpu) is None:
                continue
            step = self._mps_step(gpu)
            found[gpu.info.uuid] = running.get(gpu.info.uuid) or MpsStatus(
                shares=step.shares, thread_percentage=step.thread_percentage,
                memoryMiB=step.memory_mib, daemon="Stopped",
                pipe_directory=str(self.mps.directories(gpu.info.uuid).pipe))
        return found

    def _offers(self, observation: NodeObservation
                ) -> dict[str, tuple[GpuObservation, GpuModel, Slice]]:
        offers: dict[str, tuple[GpuObservation, GpuModel, Slice]] = {}
        for gpu in observation.gpus:
            model = self._model(gpu)
            if model is None:
                continue
            for offer in dra.devices(model, gpu.index):
                offers[offer.name] = (gpu, model, offer.slice)
        return offers

    def publish(self) -> bool:
        """Tidy the cards and write the pool; True if the pool changed."""
        with self._lock:
            self._forget_abandoned()
            observation = self._mig_mode_on(self.runtime.refresh())
            observation = self._destroy_strays(observation)
            owned = self._owned()
            curated = {uuid: set(profiles) for uuid, profiles in self.curated().items()}
            gpus: list[GpuPublication] = []
            for gpu in observation.gpus:
                model = self._model(gpu)
                if model is None:
                    continue
                held = tuple(sorted(i.slice for i in gpu.instances
                                    if (gpu.info.uuid, i.slice) not in owned
                                    and not self._kept(i)))
                taints: dict[str, tuple[tuple[str, str], ...]] = {}
                for offer in dra.devices(model, gpu.index):
                    marks = list(_health_taints(gpu))
                    if offer.slice.profile in curated.get(gpu.info.uuid, ()):
                        marks.append((dra.TAINT_CURATED, "packing"))
                    if marks:
                        taints[offer.name] = tuple(marks)
                gpus.append(GpuPublication(gpu.index, gpu.info.uuid, model, held, taints))
            shared = []
            for gpu in observation.gpus:
                card = self._shareable(gpu)
                if card is not None:
                    shared.append(MpsPublication(gpu.index, gpu.info.uuid, card.name,
                                                 gpu.info.memory_total_mib, self.mps_shares,
                                                 _health_taints(gpu)))
            written = self.pool.sync(self.node, render_pool(self.node, gpus, shared))
            if written:
                self.metrics.dra_pool_writes.inc()
            return written

    def _mig_mode_on(self, observation: NodeObservation) -> NodeObservation:
        """Turn MIG mode on for idle MIG-capable cards: a DRA node serves MIG placements only
        (whole GPUs, MPS and time-slicing stay with the device-plugin API for now). A card that
        needs a reset for it (A100, A30) is left to the admin and reported, never reset here."""
        switched = False
        for gpu in observation.gpus:
            info = gpu.info
            # GpuInfo.model names only the catalogue's MIG models: the rest stay as they are
            if (info.lost or info.model is None or info.mig_current is None or info.mig_current
                    or info.mig_pending or gpu.busy):
                continue
            result = self.backend.set_mig_mode(gpu.index, True)
            log.info("GPU %d: MIG mode on for DRA (%s)", gpu.index,
                     "done" if result.applied else "pending a reset")
            switched = True
        return self.runtime.refresh() if switched else observation

    def _kept(self, instance: ObservedInstance) -> bool:
        """A free slice kept for reuse: offered like empty room (a prepare adopts it, or
        destroys it when it needs the room), not held out of the counters."""
        return self.keep_slices and not instance.in_use and instance.mig_uuid is not None

    def _destroy_strays(self, observation: NodeObservation) -> NodeObservation:
        """Destroy free slices no claim owns (a crash between create and record, or a node
        switched from the device plugin), unless slices are kept; in-use ones stay, held out
        of the counters."""
        owned = self._owned()
        destroyed = False
        for gpu in observation.gpus:
            if self._model(gpu) is None:
                continue
            for instance in gpu.instances:
                if ((gpu.info.uuid, instance.slice) in owned or instance.in_use
                        or self._kept(instance)):
                    continue
                if instance.mig_uuid and self.backend.processes(instance.mig_uuid):
                    continue
                log.info("destroying %s on GPU %d: no claim owns it", instance.slice, gpu.index)
                try:
                    self.backend.destroy_slice(gpu.index, instance.gi_id)
                    destroyed = True
                except BackendError as exc:
                    log.warning("cannot destroy stray %s: %s", instance.slice, exc)
        return self.runtime.refresh() if destroyed else observation

    # -- ClaimPreparer ------------------------------------------------------------------------

    def prepare(self, claim: ClaimRef) -> PreparedClaim:
        """Create the claim's slices (raises :class:`PrepareError`, whose message the kubelet
        shows on the pod; nothing is left half-made)."""
        started = time.perf_counter()
        try:
            prepared = self._prepare(claim)
        except Exception:
            self.metrics.dra_claims.labels("prepare", "failed").inc()
            raise
        self.metrics.dra_claims.labels("prepare", "ok").inc()
        self.metrics.dra_prepare_seconds.observe(time.perf_counter() - started)
        return prepared

    def _prepare(self, claim: ClaimRef) -> PreparedClaim:
        with self._lock:
            done = self._prepared.get(claim.uid)
            if done is not None and done.ready:
                return PreparedClaim(tuple(self._answer(d) for d in done.devices))
            observation = self.runtime.refresh()
            if done is None:
                done = self._record(claim, observation)
                if done is None:
                    return PreparedClaim()
            try:
                self._make(done, observation)
            except (BackendError, PrepareError) as exc:
                self._roll_back(claim.uid)
                raise PrepareError(f"claim {claim.namespace}/{claim.name}: {exc}") from exc
            done.ready = True
            self._save()
            self._write_cdi(claim.uid, done)
        self.changed()
        return PreparedClaim(tuple(self._answer(d) for d in done.devices))

    def _record(self, claim: ClaimRef, observation: NodeObservation) -> _Claim | None:
        """Read the allocation, check every device, and record the claim before any create."""
        allocated = self.claims.allocated(claim.namespace, claim.name, claim.uid)
        if allocated is None:
            raise PrepareError(f"claim {claim.namespace}/{claim.name} ({claim.uid}) is gone")
        mine = [r for r in allocated if r.driver == dra.DRIVER and r.pool == self.node]
        if not mine:
            return None
        offers = self._offers(observation)
        shared = {dra.mps_device_name(g.index): g for g in observation.gpus
                  if self._shareable(g) is not None}
        owned = self._owned()
        records: list[_Record] = []
        for result in mine:
            if result.device in shared:
                gpu = shared[result.device]
                if not gpu.healthy:
                    raise PrepareError(
                        f"device {result.device} is GPU {gpu.index} ({gpu.info.uuid}), tainted "
                        f"unhealthy after Xid {gpu.last_xid}; nothing was started")
                records.append(_Record(result.request, result.device, gpu.info.uuid, gpu.index,
                                       "", 0, kind=dra.MODE_MPS, shares=result.shares,
                                       share_id=result.share_id))
                continue
            found = offers.get(result.device)
            if found is None:
                raise PrepareError(
                    f"device {result.device} is not offered by node {self.node} (its GPU is gone, "
                    "or not in MIG mode); nothing was created")
            gpu, _model, item = found
            if not gpu.healthy:
                raise PrepareError(
                    f"device {result.device} is on GPU {gpu.index} ({gpu.info.uuid}), tainted "
                    f"unhealthy after Xid {gpu.last_xid}; nothing was created")
            holder = owned.get((gpu.info.uuid, item))
            if holder is not None and holder != claim.uid:
                raise PrepareError(f"device {result.device} is already prepared for claim "
                                   f"{holder}; nothing was created")
            records.append(_Record(result.request, result.device, gpu.info.uuid, gpu.index,
                                   item.profile, item.start))
        entry = _Claim(claim.namespace, claim.name, records)
        self._prepared[claim.uid] = entry
        self._save()
        return entry

    def _make(self, entry: _Claim, observation: NodeObservation) -> None:
        """Create each recorded slice, or adopt it where it already is (a repeated call)."""
        for record in entry.devices:
            if record.kind == dra.MODE_MPS:
                self._start_mps(record, observation)
                continue
            existing = self._find(record)
            if existing is None:
                self._make_room(record, observation)
                instance = self.backend.create_slice(record.gpu_index, record.profile,
                                                     record.start)
                if instance.uuid is None:
                    instance = self.backend.create_compute_instance(record.gpu_index,
                                                                    instance.id)
                record.mig_uuid = instance.uuid
            else:
                record.mig_uuid = existing
            if record.mig_uuid is None:
                raise PrepareError(f"{record.slice} on GPU {record.gpu_index} has no MIG device")
            self._save()

    def _make_room(self, record: _Record, observation: NodeObservation) -> None:
        """Destroy the kept free slices that stand where ``record``'s slice goes (the
        scheduler counted their room as free). Owned or busy slices are never touched: if one
        is in the way, the create fails and says so."""
        if not self.keep_slices:
            return
        gpu = observation.by_uuid(record.gpu_uuid)
        model = self._model(gpu) if gpu is not None else None
        if model is None:
            return
        owned = self._owned()
        left = {Slice(i.profile, i.start): i for i in self.backend.gpu_instances(record.gpu_index)}
        wanted = record.slice.placement(model)
        # the ones overlapping the new slice first, then any other (count, compute, engines)
        for item in sorted(left, key=lambda it: (not it.placement(model).overlaps(wanted), it)):
            if conflict_with(model, list(left), record.slice) is None:
                return
            instance = left[item]
            if (record.gpu_uuid, item) in owned or instance.uuid is None:
                continue
            if self.backend.processes(instance.uuid):
                continue
            log.info("destroying kept %s on GPU %d for %s", item, record.gpu_index,
                     record.device)
            self.backend.destroy_slice(record.gpu_index, instance.id)
            del left[item]

    def _start_mps(self, record: _Record, observation: NodeObservation) -> None:
        """The GPU's MPS daemon, with the node's share settings (idempotent)."""
        assert self.mps is not None  # an MPS device is offered only with MPS configured
        gpu = observation.by_uuid(record.gpu_uuid)
        if gpu is None or self._shareable(gpu) is None:
            raise PrepareError(f"GPU {record.gpu_index} ({record.gpu_uuid}) is no longer "
                               "offered as MPS shares; nothing was started")
        self.mps.start(self._mps_step(gpu))

    def _find(self, record: _Record) -> str | None:
        """The MIG uuid of the instance at the record's placement, if there is one."""
        for instance in self.backend.gpu_instances(record.gpu_index):
            if instance.profile == record.profile and instance.start == record.start:
                if instance.uuid is None:
                    self.backend.create_compute_instance(record.gpu_index, instance.id)
                    return self._find(record)
                return instance.uuid
        return None

    def _roll_back(self, uid: str) -> None:
        entry = self._prepared.pop(uid, None)
        if entry is None:
            return
        for record in entry.devices:
            if record.mig_uuid is None or record.kind != dra.MODE_MIG:
                continue
            try:
                self._destroy(record)
            except (BackendError, PrepareError) as exc:
                log.warning("rolling back %s: %s", record.device, exc)
        self._save()

    def unprepare(self, claim: ClaimRef) -> str | None:
        """Destroy the claim's slices; idempotent (an unknown claim is done already)."""
        try:
            outcome = self._unprepare(claim)
        except Exception:
            self.metrics.dra_claims.labels("unprepare", "failed").inc()
            raise
        self.metrics.dra_claims.labels("unprepare", "ok").inc()
        return outcome

    def _unprepare(self, claim: ClaimRef) -> str | None:
        with self._lock:
            entry = self._prepared.get(claim.uid)
            if entry is None:
                return None  # never prepared here, or unprepared already
            for record in entry.devices:
                if record.kind == dra.MODE_MIG and not self.keep_slices:
                    self._destroy(record)
            del self._prepared[claim.uid]
            self._save()
            self._remove_cdi(claim.uid)
            self._stop_idle_mps(entry)
        self.changed()
        return None

    def _stop_idle_mps(self, entry: _Claim) -> None:
        """Stop the MPS daemon of a GPU whose last share was given back."""
        if self.mps is None:
            return
        still = {d.gpu_uuid for c in self._prepared.values() for d in c.devices
                 if d.kind == dra.MODE_MPS}
        for record in entry.devices:
            if record.kind == dra.MODE_MPS and record.gpu_uuid not in still:
                try:
                    self.mps.stop(StopMps(record.gpu_index, record.gpu_uuid))
                except BackendError as exc:
                    log.warning("stopping MPS on GPU %d: %s", record.gpu_index, exc)

    def _destroy(self, record: _Record) -> None:
        for instance in self.backend.gpu_instances(record.gpu_index):
            if instance.profile != record.profile or instance.start != record.start:
                continue
            uuid = instance.uuid
            if uuid is not None and self.backend.processes(uuid):
                raise PrepareError(f"{record.device} ({uuid}) still has processes; not destroyed")
            self.backend.destroy_slice(record.gpu_index, instance.id)

    # -- answers ------------------------------------------------------------------------------

    def _answer(self, record: _Record) -> PreparedDevice:
        return PreparedDevice(request_names=(record.request,), pool_name=self.node,
                              device_name=record.device,
                              cdi_device_ids=(f"{self._cdi_kind(record)}={self._cdi_name(record)}",),
                              share_id=record.share_id)

    @staticmethod
    def _cdi_kind(record: _Record) -> str:
        return CDI_KIND if record.kind == dra.MODE_MIG else CDI_MPS_KIND

    @staticmethod
    def _cdi_name(record: _Record) -> str:
        """The MIG uuid; for an MPS share the GPU uuid and the allocation's share id (many
        claims share one GPU, and CDI names must be unique)."""
        if record.kind == dra.MODE_MIG:
            return str(record.mig_uuid)
        return f"{record.gpu_uuid}-{record.share_id or record.device}"

    def _cdi_edits(self, record: _Record) -> dict[str, Any]:
        """What the container gets: the MIG device, or the GPU with its MPS daemon's pipe and
        the share's limits (as the device plugin's Allocate gives an MPS share)."""
        if record.kind == dra.MODE_MIG:
            return {"env": [f"NVIDIA_VISIBLE_DEVICES={record.mig_uuid}"]}
        assert self.mps is not None
        pipe = str(self.mps.directories(record.gpu_uuid).pipe)
        gpu = (self.runtime.latest or NodeObservation()).by_uuid(record.gpu_uuid)
        total = gpu.info.memory_total_mib if gpu is not None else 0
        memory = total * record.shares // max(1, self.mps_shares)
        threads = min(100, max(1, 100 // max(1, self.mps_shares)) * record.shares)
        return {"env": [f"NVIDIA_VISIBLE_DEVICES={record.gpu_uuid}",
                        f"{MPS_PIPE_ENV}={pipe}", f"{MPS_MEMORY_ENV}=0={memory}M",
                        f"{MPS_THREADS_ENV}={threads}"],
                "mounts": [{"hostPath": pipe, "containerPath": pipe,
                            "options": ["rbind", "rw"]}]}

    def _cdi_path(self, uid: str) -> Path | None:
        return None if self.cdi_dir is None else self.cdi_dir / f"{dra.DRIVER}-{uid}.json"

    def _write_cdi(self, uid: str, entry: _Claim) -> None:
        """The CDI spec the container runtime resolves the ids with: each device sets
        ``NVIDIA_VISIBLE_DEVICES`` to its MIG uuid, as NVIDIA's device plugin's envvar
        strategy does, so the NVIDIA container toolkit's hook mounts that one MIG device."""
        path = self._cdi_path(uid)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        for kind in (CDI_KIND, CDI_MPS_KIND):
            devices = [{"name": self._cdi_name(d), "containerEdits": self._cdi_edits(d)}
                       for d in entry.devices if self._cdi_kind(d) == kind]
            target = path if kind == CDI_KIND else path.with_name(f"{path.stem}-mps.json")
            if not devices:
                continue
            spec = {"cdiVersion": "0.6.0", "kind": kind, "devices": devices}
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(spec, indent=1), encoding="utf-8")
            os.replace(tmp, target)

    def _remove_cdi(self, uid: str) -> None:
        path = self._cdi_path(uid)
        if path is not None:
            path.unlink(missing_ok=True)
            path.with_name(f"{path.stem}-mps.json").unlink(missing_ok=True)


class DraReconciler:
    """One agent pass on a DRA node: take the controller's curation from the NodePartition,
    publish the pool, and report the cards (the runner writes the status if it changed)."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver
        self._curated: dict[str, tuple[str, ...]] = {}
        driver.curated = lambda: self._curated

    def reconcile(self, partition: NodePartition) -> ReconcileResult:
        started = time.perf_counter()
        dra_spec = partition.spec.dra
        self._curated = {c.gpu: tuple(c.profiles) for c in (dra_spec.curated if dra_spec
                                                             else [])}
        problem = ""
        try:
            self.driver.publish()
        except ApiException as exc:
            problem = f"publishing ResourceSlices failed: {exc.status} {exc.reason}"
            log.error("%s: %s", problem, str(exc.body)[:2000])
        observation = self.driver.runtime.latest or NodeObservation()
        status = dra_status(generation=partition.metadata.generation, observation=observation,
                            claims=self.driver.slice_claims(), published=not problem,
                            problem=problem, previous=partition.status, now=utc_now(),
                            mps=self.driver.mps_status())
        return ReconcileResult(status, seconds=time.perf_counter() - started)
