"""The ``tessera.dev/v1alpha1`` custom resources as typed models: the one source of their schema.

``tools/gen_crds.py`` turns these models into the CRD manifests under ``charts/tessera/crds/``
(OpenAPI v3 schema, printer columns, status subresource, CEL rules), and CI fails if they differ,
so the API server, the agent and the controller all validate against the same definition.

- ``NodePartition`` (cluster-scoped, one per GPU node, named after it): ``spec`` says what each
  GPU should be split into, written by the controller or an admin; ``status`` says what is
  really on the cards, written only by that node's agent.
- ``PartitionPolicy`` (cluster-scoped): which nodes it selects and how they are partitioned:
  ``static`` layouts (mig-parted's form), ``dynamic`` (the controller decides within allowed
  profiles), or ``mps``.

Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from tessera.core import catalogue

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Condition",
    "ConditionType",
    "GpuMode",
    "GpuSpec",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MigModeStatus",
    "MpsSpec",
    "MpsStatus",
    "NodePartition",
    "NodePartitionSpec",
    "NodePartitionStatus",
    "ObjectMeta",
    "ObservedGpu",
    "ObservedSlice",
    "PartitionPolicy",
    "PartitionPolicySpec",
    "PartitionPolicyStatus",
    "ScaleUpSpec",
    "SliceSpec",
    "StaticDeviceConfig",
    "TimesliceSpec",
    "TimesliceStatus",
    "comparable",
]

GROUP = "tessera.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

ConditionType = Literal["Applied", "Blocked", "Invalid", "ResetRequired", "Degraded", "Ready"]
GpuMode = Literal["mig", "mps", "timeslice", "none"]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server takes it: camelCase, unset and default fields left out."""
        wire = self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True,
                               mode="json")
        if "kind" in type(self).model_fields:  # a top-level object always names its type
            wire = {"apiVersion": API_VERSION, "kind": type(self).__name__, **wire}
            spec = getattr(self, "spec", None)
            if isinstance(spec, _Model):
                wire["spec"] = spec.to_wire()  # required by the schema, even when empty
        return wire


class _Tolerant(_Model):
    """Objects read back from the API server may carry fields a newer Tessera added."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )


def _cel(*rules: tuple[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": msg} for rule, msg in rules]}


_LAST_START = max(m.memory_slices for m in catalogue.models()) - 1
"""The highest placement start any catalogued card has (its grid's last unit)."""


class MpsSpec(_Model):
    """Equal MPS shares of one GPU or MIG device: each share is one allocatable device."""

    shares: int = Field(ge=1, le=catalogue.MPS_MAX_CLIENTS,
                        description="Number of clients (48 is MPS's limit through CUDA 13.0).")
    thread_percentage: int | None = Field(
        default=None, ge=1, le=100,
        description="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per share (default 100/shares).")
    memory_mi_b: int | None = Field(
        default=None, ge=1, alias="memoryMiB",
        description="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per share in MiB (default memory/shares).")
    resource: str | None = Field(
        default=None, pattern=r"^nvidia\.com/gpu\.shared(-[1-9][0-9]*gb)?$",
        description="Whole GPUs only: the resource the shares are advertised as, "
        "nvidia.com/gpu.shared (default) or memory-sized nvidia.com/gpu.shared-<N>gb.")


class SliceSpec(_Model):
    """One MIG GPU instance, with its placement: a profile at a start in memory slices."""

    profile: str = Field(
        min_length=1, max_length=32, pattern=r"^[0-9]+g\.[0-9]+gb([+-][a-z.]+)?$",
        description="MIG profile as `tessera catalogue` names it, e.g. 1g.10gb, 1g.10gb+me, "
        "1g.24gb+gfx, 1g.24gb+me.all or 1g.24gb-me.")
    start: int = Field(ge=0, le=_LAST_START, description="First memory slice of the placement "
                       "(NVML's units: 0..7 on 8-slice cards, 0..11 on the RTX PRO 6000).")
    mps: MpsSpec | None = Field(
        default=None, description="Run MPS inside this MIG device: its shares are advertised "
        "as nvidia.com/mig-<profile>.shared instead of the slice itself (memory defaults to "
        "the slice's memory / shares).")


MAX_REPLICAS = 64
"""Tessera's cap on time-slicing replicas per GPU: beyond it each replica's turn is too short
to be useful, and a typo (1000) would flood the kubelet with devices."""


class TimesliceSpec(_Model):
    """Time-slicing, as NVIDIA's device plugin's ``sharing.timeSlicing`` does it: the GPU is
    advertised as ``replicas`` devices (``<uuid>::<n>``) whose pods take turns on the whole
    card. Nothing isolates them: no memory limit, no fault isolation (one pod's fault or
    out-of-memory is every pod's)."""

    replicas: int = Field(ge=2, le=MAX_REPLICAS, description="Devices the GPU is advertised as.")
    rename_by_default: bool = Field(
        default=True, description="Advertise the replicas as nvidia.com/gpu.shared (NVIDIA's "
        "renameByDefault); false keeps nvidia.com/gpu, so pods asking a whole GPU share it.")


class GpuSpec(_Model):
    """What one GPU should be: MIG slices, MPS shares, time-slicing replicas, or left whole."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        json_schema_extra=_cel(
            ("has(self.index) != has(self.uuid)", "set exactly one of index and uuid"),
            ("self.mode == 'mig' || !has(self.slices) || size(self.slices) == 0",
             "slices are only for mode mig"),
            ("(self.mode == 'mps') == has(self.mps)", "mps is required for, and only for, "
             "mode mps"),
            ("(self.mode == 'timeslice') == has(self.timeslice)", "timeslice is required for, "
             "and only for, mode timeslice"),
        ),
    )

    index: int | None = Field(default=None, ge=0, le=63, description="NVML index of the GPU.")
    uuid: str | None = Field(default=None, pattern=r"^GPU-[0-9a-f-]{36}$",
                             description="GPU UUID, instead of index.")
    mode: GpuMode = Field(description="mig, mps, timeslice, or none (the whole GPU as "
                          "nvidia.com/gpu).")
    slices: list[SliceSpec] = Field(default_factory=list, max_length=7,
                                    description="Target MIG layout (mode mig).")
    mps: MpsSpec | None = Field(default=None, description="MPS shares (mode mps).")
    timeslice: TimesliceSpec | None = Field(
        default=None, description="Time-slicing replicas (mode timeslice).")


class DraCuration(_Model):
    """Profiles one GPU of a DRA node should not offer now (tainted ``NoSchedule``)."""

    gpu: str = Field(pattern=r"^GPU-[0-9a-f-]{36}$", description="GPU UUID.")
    profiles: list[str] = Field(default_factory=list, max_length=32,
                                description="MIG profiles whose placements are tainted.")


class DraSpec(_Model):
    """What the controller asks of a node that serves its GPUs through DRA: no layouts (the
    scheduler chooses placements), only which placements to steer it away from."""

    curated: list[DraCuration] = Field(
        default_factory=list, max_length=64,
        description="Per GPU, profiles tainted gpu.tessera.dev/curated so the scheduler's "
        "first fit packs (see the README's DRA section).")


class NodePartitionSpec(_Model):
    gpus: list[GpuSpec] = Field(default_factory=list, max_length=64)
    dra: DraSpec | None = Field(default=None, description="Only for nodes whose agent runs "
                                "with --api dra.")
    plan_id: str | None = Field(
        default=None, max_length=63,
        description="Set by the controller with each plan; the agent reports it once applied.")


class MigModeStatus(_Tolerant):
    current: bool
    pending: bool


class MpsStatus(_Tolerant):
    shares: int
    thread_percentage: int
    memory_mi_b: int = Field(alias="memoryMiB")
    resource: str = catalogue.MPS_SHARED_RESOURCE
    daemon: Literal["Running", "Starting", "Failed", "Stopped"]
    pipe_directory: str


class ObservedSlice(_Tolerant):
    profile: str
    start: int
    gpu_instance_id: int
    uuid: str | None = Field(default=None, description="MIG device UUID; unset while the GPU "
                             "instance has no compute instance.")
    allocated: bool = Field(default=False, description="The kubelet gave it to a container.")
    pods: list[str] = Field(default_factory=list, description="namespace/name of its pods.")
    processes: int = Field(default=0, description="CUDA processes NVML sees on it.")
    mps: MpsStatus | None = Field(default=None, description="The MPS daemon inside this MIG "
                                  "device, if one runs (the slice is then in use).")


class TimesliceStatus(_Tolerant):
    replicas: int
    resource: str
    """The resource the replicas are advertised as (nvidia.com/gpu.shared or nvidia.com/gpu)."""


class ObservedGpu(_Tolerant):
    index: int
    uuid: str
    name: str
    model: str | None = None
    pci_device_id: str | None = Field(default=None, description="0xDEVVEND, as mig-parted's "
                                      "device-filter names cards")
    mig_mode: MigModeStatus | None = None
    mode: GpuMode
    slices: list[ObservedSlice] = Field(default_factory=list)
    mps: MpsStatus | None = None
    timeslice: TimesliceStatus | None = None
    healthy: bool = True
    last_xid: int | None = None


class Condition(_Tolerant):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(max_length=32768)
    last_transition_time: str
    observed_generation: int | None = None


class NodePartitionStatus(_Tolerant):
    api: Literal["devicePlugin", "dra"] | None = Field(
        default=None, description="How the node hands out its GPUs: kubelet device plugins "
        "(slices made ahead by the spec) or DRA (slices made when a claim is prepared).")
    observed_generation: int | None = None
    applied_plan_id: str | None = None
    gpus: list[ObservedGpu] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class ObjectMeta(_Tolerant):
    name: str
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class NodePartition(_Tolerant):
    """How one GPU node's cards are partitioned: the wanted layout and what is really there."""

    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["NodePartition"] = "NodePartition"
    metadata: ObjectMeta
    spec: NodePartitionSpec = Field(default_factory=NodePartitionSpec)
    status: NodePartitionStatus | None = None


class LabelSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Model):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)


class StaticDeviceConfig(_Model):
    """One entry of a mig-parted ``mig-configs`` list: which devices, and how many of each."""

    devices: list[int] = Field(
        default_factory=list, description="GPU indices; empty means all (mig-parted's 'all').")
    device_filter: list[str] = Field(
        default_factory=list, description="PCI ids (0xDEVVEND) this entry applies to.")
    mig_enabled: bool = True
    mig_devices: dict[str, int] = Field(
        default_factory=dict, description="profile -> count; Tessera computes the placements.")
    mps_devices: dict[str, MpsSpec] = Field(
        default_factory=dict, description="profile -> MPS shares: every slice of that profile "
        "runs its own MPS daemon and is offered as nvidia.com/mig-<profile>.shared.")


class ScaleUpSpec(_Model):
    """Ask the cluster's autoscaler for nodes when pods fit nowhere (README "Scale-up")."""

    enabled: bool = Field(default=False, description="Off by default: with it off, pods "
                          "that fit nowhere wait, and their NoGPUFit Event says why.")
    models: list[str] = Field(
        default_factory=list, max_length=8, description="GPU models the pool's new nodes "
        "carry (catalogue names, preferred first): the waiting pods are packed into whole "
        "GPUs of these, as the planner would fill a new node's cards.")
    gpus_per_node: int = Field(
        default=8, ge=1, le=64, description="GPUs of a new node, counted for a node that has "
        "registered but does not show its GPUs yet (no nvidia.com/gpu allocatable, no "
        "nvidia.com/gpu.count label).")
    max_gpus: int = Field(default=64, ge=1, le=4096,
                          description="The most GPUs asked for at once for this policy.")
    delay_seconds: int = Field(
        default=15, ge=0, le=3600, description="How long a pod must have found no room "
        "before capacity is asked for it: a repartition in flight may yet make room.")
    arrival_timeout_seconds: int = Field(
        default=600, ge=30, description="How long a new node that has not reported its GPUs "
        "still counts as capacity on its way; after it, its pods are asked for again.")
    method: Literal["auto", "placeholders", "provisioningRequest"] = Field(
        default="auto", description="How capacity is asked: placeholder pods (Karpenter), a "
        "ProvisioningRequest (Cluster Autoscaler, GKE), or auto: ProvisioningRequest where the "
        "API server serves autoscaling.x-k8s.io/v1, placeholders otherwise.")


class PartitionPolicySpec(_Model):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        json_schema_extra=_cel(
            ("self.mode != 'static' || (has(self.static) && size(self.static) > 0)",
             "mode static needs a static layout"),
            ("self.mode != 'mps' || has(self.mps)", "mode mps needs mps"),
            ("self.mode != 'timeslice' || has(self.timeslice)",
             "mode timeslice needs timeslice"),
            ("!has(self.allowedModes) || !self.allowedModes.exists(m, m == 'timeslice') || "
             "has(self.timeslice)", "allowedModes timeslice needs timeslice (its replicas)"),
            ("!has(self.allowedModes) || !self.allowedModes.exists(m, m == 'mps') || "
             "has(self.mps)", "allowedModes mps needs mps (its shares)"),
            ("!has(self.scaleUp) || !has(self.scaleUp.enabled) || !self.scaleUp.enabled || "
             "(has(self.scaleUp.models) && size(self.scaleUp.models) > 0)",
             "scaleUp.enabled needs scaleUp.models (the GPU models new nodes carry)"),
        ),
    )

    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    mode: Literal["static", "dynamic", "mps", "timeslice"]
    allowed_profiles: list[str] = Field(
        default_factory=list, description="Profiles the controller may create (dynamic); "
        "empty means every profile of the card.")
    share_sizes_gib: list[int] = Field(
        default_factory=list, alias="shareSizesGiB", max_length=8,
        description="Dynamic sharing by MPS: memory-sized shares offered besides the plain "
        "ones, in GiB; a GPU is turned into nvidia.com/gpu.shared-<N>gb shares of N GiB (as "
        "many as its memory holds) when pods wait for that resource.")
    allowed_modes: list[Literal["mig", "mps", "timeslice"]] = Field(
        default_factory=list, max_length=3, description="Dynamic: how the controller may share "
        "cards. mig (the default when empty) splits MIG-capable cards; mps or timeslice also "
        "turns an idle whole GPU (no MIG) into shares (nvidia.com/gpu.shared) when pods wait "
        "for them, and back when every share is free. With both, mps is used.")
    static: list[StaticDeviceConfig] = Field(default_factory=list)
    mps: MpsSpec | None = None
    timeslice: TimesliceSpec | None = Field(
        default=None, description="Mode timeslice: every GPU of the selected nodes, whole, "
        "advertised as this many replicas.")
    min_repartition_interval_seconds: int = Field(
        default=0, ge=0, description="Minimum time between two repartitions of one GPU.")
    priority: int = Field(default=0, description="When policies overlap, the highest wins.")
    scale_up: ScaleUpSpec | None = Field(
        default=None, description="Ask the cluster autoscaler for nodes of this policy's "
        "pool when waiting pods fit nowhere; new nodes must carry the nodeSelector's labels.")


class PartitionPolicyStatus(_Tolerant):
    matched_nodes: list[str] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class PartitionPolicy(_Tolerant):
    """How the nodes it selects are partitioned: static layouts, dynamic, or MPS."""

    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["PartitionPolicy"] = "PartitionPolicy"
    metadata: ObjectMeta
    spec: PartitionPolicySpec
    status: PartitionPolicyStatus | None = None


def comparable(status: BaseModel | None) -> object:
    """A status as plain data without condition transition times: what "changed" means when
    deciding whether a status is worth writing again."""
    if status is None:
        return None
    dumped = status.model_dump(mode="json")
    for condition in dumped.get("conditions", []):
        condition.pop("last_transition_time", None)
    return dumped
