"""The kubelet stand-in behaves like the kubelet's device manager.

A scripted plugin (not Tessera's) drives it, so these tests pin the stand-in itself: the
kubelet's Register validation and messages, capacity/allocatable arithmetic, what happens when
a stream ends, restarts, admission errors, and how cached responses are merged.
"""

from __future__ import annotations

import collections
import queue
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tessera.kubelet import _wire
from tessera.kubelet._wire import dp
from tessera.testing import AdmissionError, Container, KubeletStandIn, Pod, short_socket_dir

R = "example.com/widget"
WAIT = 10.0


class ScriptedPlugin:
    """A device plugin whose every answer the test chooses."""

    def __init__(self, plugin_dir: Path, name: str = "widget", *, pre_start: bool = False,
                 preferred: bool = True, envs: dict[str, str] | None = None) -> None:
        self.endpoint = f"scripted-{name}.sock"
        self.socket = plugin_dir / self.endpoint
        self.options = dp.DevicePluginOptions(pre_start_required=pre_start,
                                              get_preferred_allocation_available=preferred)
        self.envs = envs or {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.allocated: list[list[str]] = []
        self._lists: queue.Queue[list[tuple[str, str]] | None] = queue.Queue()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=8))
        _wire.add_device_plugin_servicer(self, self._server)
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self._server.add_insecure_port(_wire.unix_target(self.socket))
        self._server.start()

    def register(self, kubelet: KubeletStandIn, resource: str = R, version: str = "v1beta1",
                 endpoint: str | None = None) -> None:
        request = dp.RegisterRequest(version=version, endpoint=endpoint or self.endpoint,
                                     resource_name=resource, options=self.options)
        with _wire.unix_channel(kubelet.kubelet_socket) as channel:
            _wire.registration_stub(channel).Register(request, timeout=WAIT)

    def push(self, devices: Sequence[tuple[str, str]]) -> None:
        self._lists.put(list(devices))

    def end_stream(self) -> None:
        self._lists.put(None)

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)

    # --- DevicePlugin ---
    def GetDevicePluginOptions(self, request: dp.Empty, context: object) -> dp.DevicePluginOptions:
        return self.options

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext,
                     ) -> Iterator[dp.ListAndWatchResponse]:
        while context.is_active():
            try:
                devices = self._lists.get(timeout=0.05)
            except queue.Empty:
                continue
            if devices is None:
                return
            yield dp.ListAndWatchResponse(devices=[dp.Device(ID=i, health=h) for i, h in devices])

    def GetPreferredAllocation(self, request: dp.PreferredAllocationRequest,
                               context: object) -> dp.PreferredAllocationResponse:
        self.calls["GetPreferredAllocation"] += 1
        (req,) = request.container_requests
        ids = sorted(req.available_deviceIDs, reverse=True)[:req.allocation_size]
        return dp.PreferredAllocationResponse(
            container_responses=[dp.ContainerPreferredAllocationResponse(deviceIDs=ids)])

    def Allocate(self, request: dp.AllocateRequest, context: object) -> dp.AllocateResponse:
        self.calls["Allocate"] += 1
        (req,) = request.container_requests
        self.allocated.append(list(req.devices_ids))
        return dp.AllocateResponse(container_responses=[dp.ContainerAllocateResponse(
            envs={**self.envs, "IDS": ",".join(req.devices_ids)},
            mounts=[dp.Mount(container_path="/shared", host_path=f"/host/{self.endpoint}")],
            cdi_devices=[dp.CDIDevice(name=f"example.com/widget={i}") for i in req.devices_ids])])

    def PreStartContainer(self, request: dp.PreStartContainerRequest,
                          context: object) -> dp.PreStartContainerResponse:
        self.calls["PreStartContainer"] += 1
        return dp.PreStartContainerResponse()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    with short_socket_dir() as root:
        yield root / "device-plugins"


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    with KubeletStandIn(plugin_dir, dial_timeout=0.5) as standin:
        yield standin


@pytest.fixture
def plugin(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[ScriptedPlugin]:
    scripted = ScriptedPlugin(plugin_dir)
    yield scripted
    scripted.stop()


def registered(kubelet: KubeletStandIn, plugin: ScriptedPlugin,
               devices: Sequence[tuple[str, str]]) -> None:
    plugin.register(kubelet)
    plugin.push(devices)
    kubelet.wait_until(lambda k: set(k.devices(R)) == {i for i, _ in devices}, WAIT)


@pytest.mark.parametrize(("version", "resource", "message"), [
    ("v1alpha1", R, 'requested API version "v1alpha1" is not supported by kubelet. '
                    'Supported version is ["v1beta1"]'),
    ("v1beta1", "widget", 'the ResourceName "widget" is invalid'),
    ("v1beta1", "kubernetes.io/widget", 'the ResourceName "kubernetes.io/widget" is invalid'),
])
def test_register_is_validated_with_the_kubelets_messages(
        kubelet: KubeletStandIn, plugin: ScriptedPlugin, version: str, resource: str,
        message: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        plugin.register(kubelet, resource=resource, version=version)
    assert info.value.details() == message
    (record,) = kubelet.registrations
    assert not record.accepted
    assert record.options is None  # refused before dialing the plugin


def test_register_fails_when_the_endpoint_does_not_answer(kubelet: KubeletStandIn,
                                                          plugin: ScriptedPlugin) -> None:
    with pytest.raises(grpc.RpcError) as info:
        plugin.register(kubelet, endpoint="nobody-here.sock")
    assert info.value.details().startswith("failed to dial device plugin")
    assert not kubelet.registrations[0].socket_present


def test_capacity_counts_all_devices_and_allocatable_only_exactly_healthy_ones(
        kubelet: KubeletStandIn, plugin: ScriptedPlugin) -> None:
    registered(kubelet, plugin, [("a", "Healthy"), ("b", "Unhealthy"), ("c", "healthy")])
    assert kubelet.capacity() == {R: 3}
    assert kubelet.allocatable() == {R: 1}


def test_each_list_replaces_the_whole_device_set(kubelet: KubeletStandIn,
                                                 plugin: ScriptedPlugin) -> None:
    registered(kubelet, plugin, [("a", "Healthy"), ("b", "Healthy")])
    plugin.push([("c", "Healthy")])
    kubelet.wait_until(lambda k: k.devices(R) == {"c": "Healthy"}, WAIT)


def test_an_ended_stream_turns_every_device_unhealthy_and_later_drops_capacity(
        plugin_dir: Path) -> None:
    with KubeletStandIn(plugin_dir, stop_grace_period=0.2) as kubelet:
        plugin = ScriptedPlugin(plugin_dir)
        try:
            registered(kubelet, plugin, [("a", "Healthy"), ("b", "Healthy")])
            plugin.end_stream()
            kubelet.wait_until(lambda k: k.endpoint_stopped(R), WAIT)
            assert kubelet.allocatable() == {R: 0}
            kubelet.wait_until(lambda k: k.capacity() == {R: 0}, WAIT, "grace period expiry")
        finally:
            plugin.stop()


def test_start_deletes_only_sockets(plugin_dir: Path) -> None:
    stale = ScriptedPlugin(plugin_dir, "stale")
    stale.stop()
    (plugin_dir / "kubelet_internal_checkpoint").write_text("{}")
    (plugin_dir / "DEPRECATION").write_text("")
    (plugin_dir / "subdir").mkdir()
    with KubeletStandIn(plugin_dir):
        names = {p.name for p in plugin_dir.iterdir()}
    assert "scripted-stale.sock" not in names
    assert {"kubelet_internal_checkpoint", "DEPRECATION", "subdir", "kubelet.sock"} <= names


def test_restart_keeps_allocations_and_zeroes_resources_until_re_registration(
        kubelet: KubeletStandIn, plugin: ScriptedPlugin, plugin_dir: Path) -> None:
    registered(kubelet, plugin, [("a", "Healthy"), ("b", "Healthy")])
    pod = Pod("ns", "p", (Container("c", {R: 1}),))
    kubelet.admit(pod)
    kubelet.restart()
    assert not plugin.socket.exists()
    assert kubelet.allocatable() == {R: 0}
    assert kubelet.endpoint_stopped(R)
    assert len(kubelet.allocated(R)) == 1
    replacement = ScriptedPlugin(plugin_dir)
    try:
        registered(kubelet, replacement, [("a", "Healthy"), ("b", "Healthy")])
        assert kubelet.allocatable() == {R: 2}
        assert not kubelet.endpoint_stopped(R)
    finally:
        replacement.stop()


def test_admission_errors_are_the_kubelets(kubelet: KubeletStandIn,
                                           plugin: ScriptedPlugin) -> None:
    with pytest.raises(AdmissionError, match="Node didn't have enough resource: " + R):
        kubelet.admit(Pod("ns", "p", (Container("c", {R: 1}),)))
    registered(kubelet, plugin, [("a", "Unhealthy")])
    with pytest.raises(AdmissionError, match="no healthy devices present"):
        kubelet.admit(Pod("ns", "p", (Container("c", {R: 1}),)))
    plugin.push([("a", "Healthy")])
    kubelet.wait_until(lambda k: k.allocatable() == {R: 1}, WAIT)
    with pytest.raises(AdmissionError, match=r"Requested: 2, Available: 1"):
        kubelet.admit(Pod("ns", "p", (Container("c", {R: 2}),)))
    assert plugin.calls["Allocate"] == 0


def test_allocate_uses_the_plugins_preference_and_caches_the_response(
        kubelet: KubeletStandIn, plugin: ScriptedPlugin) -> None:
    registered(kubelet, plugin, [("a", "Healthy"), ("b", "Healthy"), ("c", "Healthy")])
    pod = Pod("ns", "p", (Container("c", {R: 2}),))
    assert kubelet.admit(pod) == {"c": {R: ("c", "b")}}  # the scripted plugin prefers z..a
    assert plugin.calls["GetPreferredAllocation"] == 1
    assert kubelet.admit(pod) == {"c": {R: ("c", "b")}}  # already admitted: nothing called
    assert plugin.calls["Allocate"] == 1
    assert kubelet.allocate_response(pod, "c", R).envs["IDS"] == "c,b"


def test_no_preferred_allocation_call_unless_offered(kubelet: KubeletStandIn,
                                                     plugin_dir: Path) -> None:
    plugin = ScriptedPlugin(plugin_dir, "nopref", preferred=False)
    try:
        registered(kubelet, plugin, [("a", "Healthy"), ("b", "Healthy")])
        assert kubelet.admit(Pod("ns", "p", (Container("c", {R: 1}),))) == {"c": {R: ("a",)}}
        assert plugin.calls["GetPreferredAllocation"] == 0
    finally:
        plugin.stop()


def test_init_container_devices_are_reused_by_the_app_container(
        kubelet: KubeletStandIn, plugin: ScriptedPlugin) -> None:
    registered(kubelet, plugin, [("a", "Healthy"), ("b", "Healthy")])
    pod = Pod("ns", "p", (Container("app", {R: 1}),), init_containers=(Container("init", {R: 1}),))
    got = kubelet.admit(pod)
    assert got["init"][R] == got["app"][R]


def test_run_options_merge_first_wins_and_call_pre_start_when_required(
        kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    first = ScriptedPlugin(plugin_dir, "one", pre_start=True, envs={"SHARED": "one"})
    second = ScriptedPlugin(plugin_dir, "two", envs={"SHARED": "two"})
    try:
        first.register(kubelet, resource="example.com/one")
        second.register(kubelet, resource="example.com/two")
        first.push([("x", "Healthy")])
        second.push([("y", "Healthy")])
        kubelet.wait_until(lambda k: k.allocatable() == {"example.com/one": 1,
                                                         "example.com/two": 1}, WAIT)
        pod = Pod("ns", "p", (Container("c", {"example.com/one": 1, "example.com/two": 1}),))
        kubelet.admit(pod)
        run = kubelet.run_options(pod, "c")
        assert run.envs["SHARED"] == "one"
        assert run.mounts == (("/shared", "/host/scripted-one.sock", False),)
        assert run.cdi_devices == ("example.com/widget=x", "example.com/widget=y")
        assert first.calls["PreStartContainer"] == 1
        assert second.calls["PreStartContainer"] == 0
    finally:
        first.stop()
        second.stop()


def test_a_new_registration_replaces_the_endpoint(kubelet: KubeletStandIn,
                                                  plugin: ScriptedPlugin,
                                                  plugin_dir: Path) -> None:
    registered(kubelet, plugin, [("a", "Healthy")])
    newer = ScriptedPlugin(plugin_dir, "newer")
    try:
        registered(kubelet, newer, [("b", "Healthy")])
        kubelet.admit(Pod("ns", "p", (Container("c", {R: 1}),)))
        assert newer.calls["Allocate"] == 1
        assert plugin.calls["Allocate"] == 0
    finally:
        newer.stop()
