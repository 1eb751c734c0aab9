"""The generated bindings speak the kubelet's wire: packages, method paths, field numbers/types.

The tables below are the upstream contract (kubernetes/kubelet v1beta1 and podresources v1 at
63b3249; pluginregistration v1 and dra v1 at k8s.io/kubelet v0.37.2). If someone edits proto/
in a way that changes the wire, this fails even if the generated code was regenerated. The
pluginregistration and dra copies are also byte-for-byte upstream's, checked against the Go
module cache when it is present.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from tessera.kubelet._pb.deviceplugin.v1beta1 import api_pb2 as dp
from tessera.kubelet._pb.dra.v1 import api_pb2 as dra
from tessera.kubelet._pb.pluginregistration.v1 import api_pb2 as reg
from tessera.kubelet._pb.podresources.v1 import api_pb2 as pr

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
UPSTREAM_KUBELET = (Path(os.environ.get("GOMODCACHE") or Path.home() / "go/pkg/mod")
                    / "k8s.io/kubelet@v0.37.2/pkg/apis")
VERBATIM = ("pluginregistration/v1/api.proto", "dra/v1/api.proto")

T = FieldDescriptor
DEVICE_PLUGIN_FIELDS = {
    "DevicePluginOptions": [("pre_start_required", 1, T.TYPE_BOOL),
                            ("get_preferred_allocation_available", 2, T.TYPE_BOOL)],
    "RegisterRequest": [("version", 1, T.TYPE_STRING), ("endpoint", 2, T.TYPE_STRING),
                        ("resource_name", 3, T.TYPE_STRING), ("options", 4, T.TYPE_MESSAGE)],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, T.TYPE_MESSAGE)],
    "TopologyInfo": [("nodes", 1, T.TYPE_MESSAGE)],
    "NUMANode": [("ID", 1, T.TYPE_INT64)],
    "Device": [("ID", 1, T.TYPE_STRING), ("health", 2, T.TYPE_STRING),
               ("topology", 3, T.TYPE_MESSAGE)],
    "PreStartContainerRequest": [("devices_ids", 1, T.TYPE_STRING)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [("container_requests", 1, T.TYPE_MESSAGE)],
    "ContainerPreferredAllocationRequest": [("available_deviceIDs", 1, T.TYPE_STRING),
                                            ("must_include_deviceIDs", 2, T.TYPE_STRING),
                                            ("allocation_size", 3, T.TYPE_INT32)],
    "PreferredAllocationResponse": [("container_responses", 1, T.TYPE_MESSAGE)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, T.TYPE_STRING)],
    "AllocateRequest": [("container_requests", 1, T.TYPE_MESSAGE)],
    "ContainerAllocateRequest": [("devices_ids", 1, T.TYPE_STRING)],
    "CDIDevice": [("name", 1, T.TYPE_STRING)],
    "AllocateResponse": [("container_responses", 1, T.TYPE_MESSAGE)],
    "ContainerAllocateResponse": [("envs", 1, T.TYPE_MESSAGE), ("mounts", 2, T.TYPE_MESSAGE),
                                  ("devices", 3, T.TYPE_MESSAGE),
                                  ("annotations", 4, T.TYPE_MESSAGE),
                                  ("cdi_devices", 5, T.TYPE_MESSAGE)],
    "Mount": [("container_path", 1, T.TYPE_STRING), ("host_path", 2, T.TYPE_STRING),
              ("read_only", 3, T.TYPE_BOOL)],
    "DeviceSpec": [("container_path", 1, T.TYPE_STRING), ("host_path", 2, T.TYPE_STRING),
                   ("permissions", 3, T.TYPE_STRING)],
}
POD_RESOURCES_FIELDS = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [("devices", 1, T.TYPE_MESSAGE), ("cpu_ids", 2, T.TYPE_INT64),
                                     ("memory", 3, T.TYPE_MESSAGE)],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, T.TYPE_MESSAGE)],
    "PodResources": [("name", 1, T.TYPE_STRING), ("namespace", 2, T.TYPE_STRING),
                     ("containers", 3, T.TYPE_MESSAGE), ("cpu_ids", 4, T.TYPE_INT64),
                     ("memory", 5, T.TYPE_MESSAGE)],
    "ContainerResources": [("name", 1, T.TYPE_STRING), ("devices", 2, T.TYPE_MESSAGE),
                           ("cpu_ids", 3, T.TYPE_INT64), ("memory", 4, T.TYPE_MESSAGE),
                           ("dynamic_resources", 5, T.TYPE_MESSAGE)],
    "ContainerMemory": [("memory_type", 1, T.TYPE_STRING), ("size", 2, T.TYPE_UINT64),
                        ("topology", 3, T.TYPE_MESSAGE)],
    "ContainerDevices": [("resource_name", 1, T.TYPE_STRING), ("device_ids", 2, T.TYPE_STRING),
                         ("topology", 3, T.TYPE_MESSAGE)],
    "TopologyInfo": [("nodes", 1, T.TYPE_MESSAGE)],
    "NUMANode": [("ID", 1, T.TYPE_INT64)],
    "DynamicResource": [("claim_name", 2, T.TYPE_STRING), ("claim_namespace", 3, T.TYPE_STRING),
                        ("claim_resources", 4, T.TYPE_MESSAGE)],
    "ClaimResource": [("cdi_devices", 1, T.TYPE_MESSAGE), ("driver_name", 2, T.TYPE_STRING),
                      ("pool_name", 3, T.TYPE_STRING), ("device_name", 4, T.TYPE_STRING),
                      ("share_id", 5, T.TYPE_STRING)],
    "CDIDevice": [("name", 1, T.TYPE_STRING)],
    "GetPodResourcesRequest": [("pod_name", 1, T.TYPE_STRING),
                               ("pod_namespace", 2, T.TYPE_STRING)],
    "GetPodResourcesResponse": [("pod_resources", 1, T.TYPE_MESSAGE)],
}
PLUGIN_REGISTRATION_FIELDS = {
    "PluginInfo": [("type", 1, T.TYPE_STRING), ("name", 2, T.TYPE_STRING),
                   ("endpoint", 3, T.TYPE_STRING), ("supported_versions", 4, T.TYPE_STRING)],
    "RegistrationStatus": [("plugin_registered", 1, T.TYPE_BOOL), ("error", 2, T.TYPE_STRING)],
    "RegistrationStatusResponse": [],
    "InfoRequest": [],
}
DRA_FIELDS = {
    "NodePrepareResourcesRequest": [("claims", 1, T.TYPE_MESSAGE)],
    "NodePrepareResourcesResponse": [("claims", 1, T.TYPE_MESSAGE)],
    "NodePrepareResourceResponse": [("devices", 1, T.TYPE_MESSAGE), ("error", 2, T.TYPE_STRING)],
    "Device": [("request_names", 1, T.TYPE_STRING), ("pool_name", 2, T.TYPE_STRING),
               ("device_name", 3, T.TYPE_STRING), ("cdi_device_ids", 4, T.TYPE_STRING),
               ("share_id", 5, T.TYPE_STRING)],
    "NodeUnprepareResourcesRequest": [("claims", 1, T.TYPE_MESSAGE)],
    "NodeUnprepareResourcesResponse": [("claims", 1, T.TYPE_MESSAGE)],
    "NodeUnprepareResourceResponse": [("error", 1, T.TYPE_STRING)],
    "Claim": [("namespace", 1, T.TYPE_STRING), ("uid", 2, T.TYPE_STRING),
              ("name", 3, T.TYPE_STRING)],
}
REPEATED = {("PluginInfo", "supported_versions"),
            ("NodePrepareResourcesRequest", "claims"), ("NodePrepareResourcesResponse", "claims"),
            ("NodePrepareResourceResponse", "devices"), ("Device", "request_names"),
            ("Device", "cdi_device_ids"), ("NodeUnprepareResourcesRequest", "claims"),
            ("NodeUnprepareResourcesResponse", "claims"),
            ("ListAndWatchResponse", "devices"), ("TopologyInfo", "nodes"),
            ("PreStartContainerRequest", "devices_ids"),
            ("PreferredAllocationRequest", "container_requests"),
            ("ContainerPreferredAllocationRequest", "available_deviceIDs"),
            ("ContainerPreferredAllocationRequest", "must_include_deviceIDs"),
            ("PreferredAllocationResponse", "container_responses"),
            ("ContainerPreferredAllocationResponse", "deviceIDs"),
            ("AllocateRequest", "container_requests"), ("ContainerAllocateRequest", "devices_ids"),
            ("AllocateResponse", "container_responses"), ("ContainerAllocateResponse", "envs"),
            ("ContainerAllocateResponse", "mounts"), ("ContainerAllocateResponse", "devices"),
            ("ContainerAllocateResponse", "annotations"),
            ("ContainerAllocateResponse", "cdi_devices"),
            ("AllocatableResourcesResponse", "devices"),
            ("AllocatableResourcesResponse", "cpu_ids"),
            ("AllocatableResourcesResponse", "memory"),
            ("ListPodResourcesResponse", "pod_resources"),
            ("PodResources", "containers"), ("PodResources", "cpu_ids"), ("PodResources", "memory"),
            ("ContainerResources", "devices"), ("ContainerResources", "cpu_ids"),
            ("ContainerResources", "memory"), ("ContainerResources", "dynamic_resources"),
            ("ContainerDevices", "device_ids"), ("DynamicResource", "claim_resources"),
            ("ClaimResource", "cdi_devices")}


def test_packages_are_upstreams() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert dra.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"


@pytest.mark.parametrize(("module", "service", "methods"), [
    (dp, "Registration", {"Register": ("RegisterRequest", "Empty", False)}),
    (dp, "DevicePlugin", {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest",
                                   "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    }),
    (pr, "PodResourcesLister", {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse", False),
        "GetAllocatableResources": ("AllocatableResourcesRequest",
                                    "AllocatableResourcesResponse", False),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse", False),
    }),
    (reg, "Registration", {
        "GetInfo": ("InfoRequest", "PluginInfo", False),
        "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse", False),
    }),
    (dra, "DRAPlugin", {
        "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse",
                                 False),
        "NodeUnprepareResources": ("NodeUnprepareResourcesRequest",
                                   "NodeUnprepareResourcesResponse", False),
    }),
])
def test_services_have_upstream_methods(module: object, service: str,
                                        methods: dict[str, tuple[str, str, bool]]) -> None:
    descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    found = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
             for m in descriptor.methods}
    assert found == methods
    assert all(not m.client_streaming for m in descriptor.methods)


@pytest.mark.parametrize(("module", "table"), [(dp, DEVICE_PLUGIN_FIELDS),
                                                (pr, POD_RESOURCES_FIELDS),
                                                (reg, PLUGIN_REGISTRATION_FIELDS),
                                                (dra, DRA_FIELDS)])
def test_messages_have_upstream_fields(module: object,
                                       table: dict[str, list[tuple[str, int, int]]]) -> None:
    messages = module.DESCRIPTOR.message_types_by_name  # type: ignore[attr-defined]
    assert set(messages) == set(table)
    for name, fields in table.items():
        found = [(f.name, f.number, f.type) for f in messages[name].fields]
        assert found == fields, name
        for f in messages[name].fields:
            assert f.is_repeated == ((name, f.name) in REPEATED), (name, f.name)


def test_share_id_is_proto3_optional() -> None:
    field = pr.ClaimResource.DESCRIPTOR.fields_by_name["share_id"]
    assert field.has_presence
    assert dra.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence


def test_prepare_results_are_maps_keyed_by_claim_uid() -> None:
    for response, value in ((dra.NodePrepareResourcesResponse, "NodePrepareResourceResponse"),
                            (dra.NodeUnprepareResourcesResponse,
                             "NodeUnprepareResourceResponse")):
        entry = response.DESCRIPTOR.fields_by_name["claims"].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == T.TYPE_STRING
        value_type = entry.fields_by_name["value"].message_type
        assert value_type is not None
        assert value_type.name == value


@pytest.mark.parametrize("proto", VERBATIM)
def test_dra_protos_are_verbatim_upstream_copies(proto: str) -> None:
    upstream = UPSTREAM_KUBELET / proto
    if not upstream.is_file():
        pytest.skip(f"Go module cache has no {upstream}")
    assert (PROTO_DIR / proto).read_bytes() == upstream.read_bytes()


def test_method_paths_are_what_the_kubelet_dials() -> None:
    paths = {f"/{s.full_name}/{m.name}" for f in (dp.DESCRIPTOR, pr.DESCRIPTOR)
             for s in f.services_by_name.values() for m in s.methods}
    assert {"/v1beta1.Registration/Register", "/v1beta1.DevicePlugin/ListAndWatch",
            "/v1beta1.DevicePlugin/Allocate", "/v1beta1.DevicePlugin/GetPreferredAllocation",
            "/v1.PodResourcesLister/List",
            "/v1.PodResourcesLister/GetAllocatableResources"} <= paths
    dra_paths = {f"/{s.full_name}/{m.name}" for f in (reg.DESCRIPTOR, dra.DESCRIPTOR)
                 for s in f.services_by_name.values() for m in s.methods}
    assert dra_paths == {"/pluginregistration.Registration/GetInfo",
                         "/pluginregistration.Registration/NotifyRegistrationStatus",
                         "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                         "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"}
