"""The generated bindings speak the kubelet's wire: packages, method paths, field numbers/types.

The table below is the upstream contract (kubernetes/kubelet v1beta1 and podresources v1 at
63b3249). If someone edits proto/ in a way that changes the wire, this fails even if the
generated code was regenerated.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor

from tessera.kubelet._pb.deviceplugin.v1beta1 import api_pb2 as dp
from tessera.kubelet._pb.podresources.v1 import api_pb2 as pr

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
REPEATED = {("ListAndWatchResponse", "devices"), ("TopologyInfo", "nodes"),
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
])
def test_services_have_upstream_methods(module: object, service: str,
                                        methods: dict[str, tuple[str, str, bool]]) -> None:
    descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    found = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
             for m in descriptor.methods}
    assert found == methods
    assert all(not m.client_streaming for m in descriptor.methods)


@pytest.mark.parametrize(("module", "table"), [(dp, DEVICE_PLUGIN_FIELDS),
                                                (pr, POD_RESOURCES_FIELDS)])
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


def test_method_paths_are_what_the_kubelet_dials() -> None:
    paths = {f"/{s.full_name}/{m.name}" for f in (dp.DESCRIPTOR, pr.DESCRIPTOR)
             for s in f.services_by_name.values() for m in s.methods}
    assert {"/v1beta1.Registration/Register", "/v1beta1.DevicePlugin/ListAndWatch",
            "/v1beta1.DevicePlugin/Allocate", "/v1beta1.DevicePlugin/GetPreferredAllocation",
            "/v1.PodResourcesLister/List",
            "/v1.PodResourcesLister/GetAllocatableResources"} <= paths
