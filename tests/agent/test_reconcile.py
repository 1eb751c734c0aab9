"""Planning the agent's steps: the rules that protect pods, written as specifications."""

from __future__ import annotations

from tessera.agent.observation import GpuObservation, NodeObservation, ObservedInstance
from tessera.agent.reconcile import (
    CompleteSlice,
    CreateSlice,
    DestroySlice,
    MpsTarget,
    SetMigMode,
    SetTimeslice,
    StartMps,
    StopMps,
    StopTimeslice,
    TimesliceTarget,
    plan_node,
)
from tessera.api.v1alpha1 import GpuSpec, MpsSpec, NodePartitionSpec, SliceSpec, TimesliceSpec
from tessera.core.layout import Slice, parse_slice
from tessera.nvml.backend import GpuInfo

A100 = "A100-SXM4-80GB"


def gpu(index: int = 0, *, mig: bool = True, instances: tuple[ObservedInstance, ...] = (),
        pods: tuple[str, ...] = (), processes: int = 0, name: str = "NVIDIA A100-SXM4-80GB",
        model: str | None = "A100-80GB", whole: tuple[str, ...] = ()) -> GpuObservation:
    info = GpuInfo(index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", name=name,
                   pci_bus_id="", pci_device_id=0x20B210DE if model else 0x27B810DE,
                   memory_total_mib=81920, model=model,
                   mig_current=mig if model else None, mig_pending=mig if model else None)
    return GpuObservation(info=info, instances=instances, pods=pods, processes=processes,
                          whole_holders=whole)


def inst(text: str, gi: int, *, pods: tuple[str, ...] = (), processes: int = 0,
         complete: bool = True) -> ObservedInstance:
    s = parse_slice(text)
    size = {"1g.10gb": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4,
            "7g.80gb": 8}[s.profile]
    return ObservedInstance(gi_id=gi, profile=s.profile, start=s.start, size=size,
                            mig_uuid=f"MIG-{gi:08d}-0000-5000-0000-000000000000" if complete
                            else None, pods=pods, processes=processes)


def mig_spec(*slices: str, index: int = 0) -> GpuSpec:
    return GpuSpec(index=index, mode="mig", slices=[
        SliceSpec(profile=parse_slice(s).profile, start=parse_slice(s).start) for s in slices])


def node_spec(*gpus: GpuSpec) -> NodePartitionSpec:
    return NodePartitionSpec(gpus=list(gpus))


def test_a_whole_idle_gpu_gets_mig_mode_first() -> None:
    plan = plan_node(node_spec(mig_spec("7g.80gb@0")), NodeObservation((gpu(mig=False),)))
    assert plan.steps == [SetMigMode(0, True)]


def test_mig_mode_is_never_switched_under_a_pod() -> None:
    observed = NodeObservation((gpu(mig=False, pods=("ml/train",)),))
    plan = plan_node(node_spec(mig_spec("7g.80gb@0")), observed)
    assert plan.steps == []
    assert plan.gpus[0].blocked == [
        "GPU 0 must be idle to enable MIG mode, but is used by pod ml/train"]


def test_slices_go_destroy_first_then_create() -> None:
    observed = NodeObservation((gpu(instances=(inst("7g.80gb@0", 0),)),))
    plan = plan_node(node_spec(mig_spec("3g.40gb@4", "1g.10gb@0")), observed)
    assert plan.steps == [
        DestroySlice(0, 0, Slice("7g.80gb", 0), "MIG-00000000-0000-5000-0000-000000000000"),
        CreateSlice(0, Slice("3g.40gb", 4)),
        CreateSlice(0, Slice("1g.10gb", 0)),
    ]


def test_an_in_use_slice_is_kept_and_the_rest_still_applies() -> None:
    observed = NodeObservation((gpu(instances=(
        inst("1g.10gb@0", 7, pods=("default/infer-0",)),
        inst("1g.10gb@1", 8),
    )),))
    plan = plan_node(node_spec(mig_spec("4g.40gb@0", "3g.40gb@4")), observed)
    assert plan.steps == [
        DestroySlice(0, 8, Slice("1g.10gb", 1), "MIG-00000008-0000-5000-0000-000000000000"),
        CreateSlice(0, Slice("3g.40gb", 4)),
    ]
    blocked = plan.gpus[0].blocked
    assert "1g.10gb@0 (MIG-00000007-0000-5000-0000-000000000000) on GPU 0 is in use by pod " \
           "default/infer-0; it stays until they finish" in blocked
    assert any(m.startswith("4g.40gb@0 on GPU 0 waits: 4g.40gb@0 (0:4) overlaps 1g.10gb@0")
               and "held by pod default/infer-0" in m for m in blocked)


def test_processes_outside_kubernetes_also_protect_a_slice() -> None:
    observed = NodeObservation((gpu(instances=(inst("7g.80gb@0", 0, processes=2),)),))
    plan = plan_node(node_spec(mig_spec("1g.10gb@0")), observed)
    assert plan.steps == []
    assert "2 CUDA process(es) outside Kubernetes" in plan.gpus[0].blocked[0]


def test_unknown_allocations_protect_every_complete_slice() -> None:
    unsure = ObservedInstance(gi_id=0, profile="7g.80gb", start=0, size=8,
                              mig_uuid="MIG-00000000-0000-5000-0000-000000000000",
                              use_unknown=True)
    plan = plan_node(node_spec(mig_spec("1g.10gb@0")), NodeObservation((gpu(
        instances=(unsure,)),)))
    assert plan.steps == []
    assert "PodResources could not be read" in plan.gpus[0].blocked[0]


def test_a_creation_cut_short_is_completed_or_removed() -> None:
    observed = NodeObservation((gpu(instances=(
        inst("3g.40gb@4", 2, complete=False), inst("1g.10gb@0", 7, complete=False)),),))
    plan = plan_node(node_spec(mig_spec("3g.40gb@4")), observed)
    assert plan.steps == [DestroySlice(0, 7, Slice("1g.10gb", 0), None),
                          CompleteSlice(0, 2, Slice("3g.40gb", 4))]


def test_a_matching_card_needs_nothing() -> None:
    observed = NodeObservation((gpu(instances=(inst("3g.40gb@4", 2), inst("4g.40gb@0", 1))),))
    plan = plan_node(node_spec(mig_spec("4g.40gb@0", "3g.40gb@4")), observed)
    assert plan.settled


def test_bad_specs_are_invalid_with_the_field_and_get_no_steps() -> None:
    observed = NodeObservation((gpu(0, mig=False), gpu(1, model=None, name="NVIDIA L4")))
    plan = plan_node(node_spec(
        mig_spec("1g.10gb@7"),
        GpuSpec(index=1, mode="mig", slices=[]),
        GpuSpec(index=5, mode="none"),
        GpuSpec(index=0, mode="mps", mps=MpsSpec(shares=2, memory_mi_b=50000)),
    ), observed)
    assert plan.steps == []
    assert plan.gpus[0].invalid == [
        "spec.gpus[0].slices[0].start: 1g.10gb cannot start at memory slice 7 on A100-80GB "
        "(valid starts: 0, 1, 2, 3, 4, 5, 6)"]
    assert plan.gpus[1].invalid[0].startswith(
        "spec.gpus[1].mode: GPU 1 is a NVIDIA L4, which cannot do MIG")
    assert plan.gpus[2].invalid == ["spec.gpus[2].index: this node has no GPU 5 (valid: 0, 1)"]
    assert plan.gpus[3].invalid == [
        "spec.gpus[3].mps.memoryMiB: 2 shares x 50000 MiB exceed GPU 0's 81920 MiB; lower "
        "memoryMiB or shares"]


def test_a_gpu_named_twice_is_invalid() -> None:
    observed = NodeObservation((gpu(0),))
    plan = plan_node(node_spec(mig_spec("7g.80gb@0"), GpuSpec(
        uuid="GPU-00000000-0000-0000-0000-000000000000", mode="none")), observed)
    assert plan.gpus[1].invalid == [
        "spec.gpus[1]: GPU 0 is already given by spec.gpus[0]; name each GPU once"]
    assert plan.gpus[1].steps == []


def test_mode_none_empties_the_card_then_leaves_mig() -> None:
    observed = NodeObservation((gpu(instances=(inst("3g.40gb@0", 1),)),))
    first = plan_node(node_spec(GpuSpec(index=0, mode="none")), observed)
    assert first.steps == [DestroySlice(0, 1, Slice("3g.40gb", 0),
                                        "MIG-00000001-0000-5000-0000-000000000000")]
    second = plan_node(node_spec(GpuSpec(index=0, mode="none")), NodeObservation((gpu(),)))
    assert second.steps == [SetMigMode(0, False)]


def test_mps_starts_on_a_whole_gpu_and_stops_when_the_mode_changes() -> None:
    spec = node_spec(GpuSpec(index=0, mode="mps", mps=MpsSpec(shares=4)))
    whole = NodeObservation((gpu(mig=False),))
    assert plan_node(spec, whole).steps == [StartMps(0, whole.gpus[0].info.uuid, 4, 25, 20480)]
    running = {whole.gpus[0].info.uuid: MpsTarget(4, 25, 20480)}
    assert plan_node(spec, whole, running).settled
    other = {whole.gpus[0].info.uuid: MpsTarget(2, 50, 40960)}
    assert plan_node(spec, whole, other).steps == [
        StartMps(0, whole.gpus[0].info.uuid, 4, 25, 20480)], "new settings restart the daemon"
    held = NodeObservation((gpu(mig=False, pods=("ml/a",)),))
    assert plan_node(spec, held, other).gpus[0].blocked == [
        "GPU 0: new MPS settings wait until no pod holds a share (ml/a)"]
    back = plan_node(node_spec(mig_spec("7g.80gb@0")), whole, running)
    assert back.steps == [StopMps(0, whole.gpus[0].info.uuid)]


def test_mps_does_not_start_under_processes_already_on_the_gpu() -> None:
    spec = node_spec(GpuSpec(index=0, mode="mps", mps=MpsSpec(shares=4)))
    busy = NodeObservation((gpu(mig=False, model=None, processes=2),))
    assert plan_node(spec, busy).gpus[0].blocked == [
        "GPU 0 is used by 2 CUDA process(es); MPS starts once it is idle"]


def _timeslice(replicas: int, rename: bool = True) -> NodePartitionSpec:
    return node_spec(GpuSpec(index=0, mode="timeslice", timeslice=TimesliceSpec(
        replicas=replicas, rename_by_default=rename)))


def test_time_slicing_advertises_replicas_of_a_whole_gpu_and_changes_nothing_on_it() -> None:
    l4 = NodeObservation((gpu(mig=False, name="NVIDIA L4", model=None),))
    uuid = l4.gpus[0].info.uuid
    assert plan_node(_timeslice(4), l4).steps == [
        SetTimeslice(0, uuid, 4, "nvidia.com/gpu.shared")]
    assert plan_node(_timeslice(4, rename=False), l4).steps == [
        SetTimeslice(0, uuid, 4, "nvidia.com/gpu")], "renameByDefault: false keeps the name"
    running = {uuid: TimesliceTarget(4, "nvidia.com/gpu.shared")}
    assert plan_node(_timeslice(4), l4, timesliced=running).settled
    a100 = NodeObservation((gpu(mig=True),))
    assert plan_node(_timeslice(4), a100).steps == [SetMigMode(0, False)], "whole first"


def test_time_slicing_never_takes_a_device_a_pod_holds() -> None:
    held_whole = NodeObservation((gpu(mig=False, model=None, pods=("ml/a",), whole=("ml/a",)),))
    assert plan_node(_timeslice(4), held_whole).gpus[0].blocked == [
        "GPU 0 is held whole by ml/a; time-slicing waits until it ends"]
    held = NodeObservation((gpu(mig=False, model=None, pods=("ml/a",)),))
    uuid = held.gpus[0].info.uuid
    four = {uuid: TimesliceTarget(4, "nvidia.com/gpu.shared")}
    assert plan_node(_timeslice(8), held, timesliced=four).steps == [
        SetTimeslice(0, uuid, 8, "nvidia.com/gpu.shared")], "more replicas take nothing away"
    assert plan_node(_timeslice(2), held, timesliced=four).gpus[0].blocked == [
        "GPU 0: fewer or renamed replicas wait until no pod holds one (ml/a)"]
    assert plan_node(_timeslice(4), held).steps == [
        SetTimeslice(0, uuid, 4, "nvidia.com/gpu.shared")], "after a restart: offered again"
    leaving = plan_node(node_spec(GpuSpec(index=0, mode="none")), held, timesliced=four)
    assert leaving.gpus[0].blocked == ["GPU 0 is time-sliced for ml/a"]
    free = NodeObservation((gpu(mig=False, model=None),))
    assert plan_node(node_spec(GpuSpec(index=0, mode="none")), free,
                     timesliced=four).steps == [StopTimeslice(0, uuid)]


def test_gpus_the_spec_does_not_name_are_left_alone() -> None:
    observed = NodeObservation((gpu(0, instances=(inst("7g.80gb@0", 0),)), gpu(1)))
    plan = plan_node(node_spec(mig_spec("7g.80gb@0", index=0)), observed)
    assert plan.steps == []
    assert [g.gpu for g in plan.gpus] == [0]
