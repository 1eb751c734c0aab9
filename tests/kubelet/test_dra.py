"""Our DRA driver's sockets against the DRA kubelet stand-in, over real gRPC on real sockets.

What the kubelet needs from a DRA driver: the DRA endpoint served before the registration
socket appears in plugins_registry; a GetInfo naming type ``DRAPlugin``, the driver, the
endpoint's absolute path and ``v1.DRAPlugin``; an answer for every claim of every
Prepare/Unprepare call, keyed by claim UID, where one claim's failure is that claim's error
only; sockets that a restarted driver replaces and a stopped driver removes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tessera.core.errors import InvalidInputError
from tessera.kubelet import _wire
from tessera.kubelet._wire import dra, reg
from tessera.kubelet.dra import (
    ClaimRef,
    DraPluginServer,
    PreparedClaim,
    PreparedDevice,
)
from tessera.testing import AdmissionError
from tessera.testing.kubelet import DraKubelet, dra_response_error

from .conftest import WAIT

DRIVER = "gpu.tessera.dev"
CDI_1G = "k8s.gpu.tessera.dev/mig=MIG-0001"
CDI_3G = "k8s.gpu.tessera.dev/mig=MIG-0002"
A = ClaimRef("team-a", "0d3a6c1e-aaaa-4000-8000-000000000001", "train-gpu")
B = ClaimRef("team-b", "0d3a6c1e-bbbb-4000-8000-000000000002", "infer-gpu")
C = ClaimRef("team-c", "0d3a6c1e-cccc-4000-8000-000000000003", "notebook-gpu")
D = ClaimRef("team-d", "0d3a6c1e-dddd-4000-8000-000000000004", "batch-gpu")

Answer = PreparedClaim | str | Exception


class ScriptedPreparer:
    """A ClaimPreparer whose answer per claim name the test chooses; records every call."""

    def __init__(self) -> None:
        self.prepared: dict[str, Answer] = {}
        self.unprepared: dict[str, str | Exception | None] = {}
        self.calls: list[tuple[str, ClaimRef]] = []
        self.delay = 0.0
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def prepare(self, claim: ClaimRef) -> PreparedClaim | str:
        answer = self._enter("prepare", claim, self.prepared.get(claim.name, PreparedClaim()))
        assert isinstance(answer, (PreparedClaim, str))
        return answer

    def unprepare(self, claim: ClaimRef) -> str | None:
        answer = self._enter("unprepare", claim, self.unprepared.get(claim.name))
        assert not isinstance(answer, (Exception, PreparedClaim))
        return answer

    def _enter(self, method: str, claim: ClaimRef, answer: Answer | None) -> Answer | None:
        with self._lock:
            self.calls.append((method, claim))
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if self.delay:
                time.sleep(self.delay)  # simulated work, so overlapping calls would show
            if isinstance(answer, Exception):
                raise answer
            return answer
        finally:
            with self._lock:
                self.active -= 1


def mig_1g(*requests: str) -> PreparedDevice:
    return PreparedDevice(requests, "node-a", "gpu-0-mig-1g-10gb-0", (CDI_1G,))


def mig_3g(*requests: str) -> PreparedDevice:
    return PreparedDevice(requests, "node-a", "gpu-1-mig-3g-40gb-4", (CDI_3G,))


@pytest.fixture
def registry_dir(socket_root: Path) -> Path:
    return socket_root / "plugins_registry"


@pytest.fixture
def driver_dir(socket_root: Path) -> Path:
    return socket_root / "plugins" / DRIVER


@pytest.fixture
def preparer() -> ScriptedPreparer:
    return ScriptedPreparer()


@pytest.fixture
def server(registry_dir: Path, driver_dir: Path,
           preparer: ScriptedPreparer) -> Iterator[DraPluginServer]:
    """Our driver's sockets, serving (stopped at teardown)."""
    with DraPluginServer(DRIVER, preparer, plugins_registry_dir=registry_dir,
                         plugin_dir=driver_dir) as running:
        yield running


@pytest.fixture
def kubelet(registry_dir: Path) -> Iterator[DraKubelet]:
    # GetInfo's real deadline is 1 s; a loaded CI box gets the suite's generous wait instead.
    with DraKubelet(registry_dir, dial_timeout=5.0, get_info_timeout=WAIT) as standin:
        yield standin


@pytest.fixture
def registered(server: DraPluginServer, kubelet: DraKubelet) -> DraPluginServer:
    kubelet.wait_for_driver(DRIVER, WAIT)
    return server


# --- registration ---------------------------------------------------------------------------


def test_the_kubelet_reads_the_drivers_info_from_its_registration_socket(
        server: DraPluginServer, kubelet: DraKubelet, registry_dir: Path,
        driver_dir: Path) -> None:
    [attempt] = kubelet.sync()
    assert attempt.socket_path == str(registry_dir / "gpu.tessera.dev-reg.sock")
    assert attempt.plugin_type == "DRAPlugin"
    assert attempt.name == DRIVER
    assert attempt.endpoint == str(driver_dir / "dra.sock")
    assert os.path.isabs(attempt.endpoint)  # the kubelet dials unix:<endpoint> as given
    assert attempt.supported_versions == ("v1.DRAPlugin",)
    assert attempt.service == "v1.DRAPlugin"
    assert attempt.endpoint_present, "the registration socket appeared before the endpoint"
    assert attempt.accepted
    assert attempt.notified
    assert attempt.error is None
    assert kubelet.drivers() == {DRIVER: attempt.endpoint}


def test_the_kubelets_acceptance_is_recorded(server: DraPluginServer,
                                             kubelet: DraKubelet) -> None:
    assert not server.registered
    assert server.notifications == 0
    kubelet.sync()
    assert server.registered
    assert server.registration_error is None
    assert server.notifications == 1
    assert server.wait_until_registered(timeout=0)


def test_a_refused_registration_is_recorded_with_the_kubelets_error(
        server: DraPluginServer, registry_dir: Path) -> None:
    # A kubelet from before dra/v1 (it knew v1beta1 only) cannot use our driver.
    with DraKubelet(registry_dir, services=("v1beta1.DRAPlugin",),
                    get_info_timeout=WAIT) as old_kubelet:
        [attempt] = old_kubelet.sync()
        assert not attempt.accepted
        assert attempt.notified
        assert attempt.error == (
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
            f"versions of DRA driver plugin {DRIVER} at endpoint {server.endpoint}: none of "
            'services supported by the plugin (["v1.DRAPlugin"]) are supported by the kubelet '
            '(["v1beta1.DRAPlugin"])')
        assert not server.registered
        assert server.registration_error == attempt.error
        assert old_kubelet.drivers() == {}
        assert not server.wait_until_registered(timeout=0.05)

        old_kubelet.sync()  # the kubelet retries a refused socket
        assert server.notifications == 2


def test_the_latest_verdict_wins_after_a_refusal(server: DraPluginServer,
                                                 registry_dir: Path,
                                                 kubelet: DraKubelet) -> None:
    with DraKubelet(registry_dir, services=(), get_info_timeout=WAIT) as refusing:
        refusing.sync()
    assert server.registration_error is not None
    kubelet.sync()
    assert server.registered
    assert server.registration_error is None


def test_the_default_sockets_are_where_the_kubelet_and_nvidias_driver_put_them(
        preparer: ScriptedPreparer) -> None:
    server = DraPluginServer(DRIVER, preparer)  # not started: nothing touches /var/lib
    assert server.registration_socket == (
        "/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock")
    assert server.endpoint == "/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock"


# --- NodePrepareResources -------------------------------------------------------------------


def test_prepare_returns_each_claims_devices_keyed_by_claim_uid(
        registered: DraPluginServer, kubelet: DraKubelet, preparer: ScriptedPreparer) -> None:
    preparer.prepared = {
        A.name: PreparedClaim((mig_1g("gpu"),)),
        B.name: PreparedClaim((mig_3g("big/mig-3g"), PreparedDevice(
            (), "node-a", "gpu-1-mps-0", (), share_id="5f1c2d8e-0000-4000-8000-000000000000"))),
        C.name: PreparedClaim(),
    }
    response = kubelet.prepare(DRIVER, [A, B, C])

    assert set(response.claims) == {A.uid, B.uid, C.uid}
    assert dra_response_error("NodePrepareResources", [A, B, C], response) is None
    [device] = response.claims[A.uid].devices
    assert (list(device.request_names), device.pool_name, device.device_name,
            list(device.cdi_device_ids)) == (["gpu"], "node-a", "gpu-0-mig-1g-10gb-0", [CDI_1G])
    assert not device.HasField("share_id")
    mig, shared = response.claims[B.uid].devices
    assert list(mig.request_names) == ["big"]  # subrequest "big/mig-3g" is sent as its request
    assert list(shared.request_names) == []  # all of the claim's requests
    assert shared.share_id == "5f1c2d8e-0000-4000-8000-000000000000"
    assert list(response.claims[C.uid].devices) == []
    assert all(result.error == "" for result in response.claims.values())
    assert preparer.calls == [("prepare", A), ("prepare", B), ("prepare", C)]


def test_one_failing_claim_does_not_fail_the_others(
        registered: DraPluginServer, kubelet: DraKubelet, preparer: ScriptedPreparer) -> None:
    preparer.prepared = {
        A.name: PreparedClaim((mig_1g(),)),
        B.name: RuntimeError("no free 1g.10gb placement on GPU 0"),
        C.name: "GPU 1 is being repartitioned",
        D.name: PreparedClaim((mig_3g(),)),
    }
    response = kubelet.prepare(DRIVER, [A, B, C, D])

    assert preparer.calls == [("prepare", c) for c in (A, B, C, D)]
    assert set(response.claims) == {A.uid, B.uid, C.uid, D.uid}
    assert response.claims[B.uid].error == "no free 1g.10gb placement on GPU 0"
    assert response.claims[C.uid].error == "GPU 1 is being repartitioned"
    assert [d.device_name for d in response.claims[A.uid].devices] == ["gpu-0-mig-1g-10gb-0"]
    assert [d.device_name for d in response.claims[D.uid].devices] == ["gpu-1-mig-3g-40gb-4"]
    assert response.claims[A.uid].error == response.claims[D.uid].error == ""
    # The kubelet fails this pod's start on a failed claim and calls again later.
    verdict = dra_response_error("NodePrepareResources", [A, B, C, D], response)
    assert verdict is not None
    assert verdict.startswith("NodePrepareResources failed for ResourceClaim ")


def test_a_failure_never_travels_as_an_empty_error(
        registered: DraPluginServer, kubelet: DraKubelet, preparer: ScriptedPreparer) -> None:
    preparer.prepared = {A.name: "", B.name: KeyError()}
    preparer.unprepared = {A.name: ""}
    prepared = kubelet.prepare(DRIVER, [A, B])
    assert prepared.claims[A.uid].error == "prepare failed without a message"
    assert prepared.claims[B.uid].error == "KeyError"
    unprepared = kubelet.unprepare(DRIVER, [A])
    assert unprepared.claims[A.uid].error == "unprepare failed without a message"


def test_calls_are_serialized_so_the_preparer_never_races_itself(
        registered: DraPluginServer, kubelet: DraKubelet, preparer: ScriptedPreparer) -> None:
    preparer.delay = 0.05
    with ThreadPoolExecutor(max_workers=4) as pool:
        prepares = [pool.submit(kubelet.prepare, DRIVER, [claim]) for claim in (A, B, C, D)]
        unprepare = pool.submit(kubelet.unprepare, DRIVER, [A])
        for future in prepares:
            future.result(timeout=WAIT)
        unprepare.result(timeout=WAIT)
    assert len(preparer.calls) == 5
    assert preparer.most_active == 1


def test_an_empty_request_gets_an_empty_answer(registered: DraPluginServer,
                                              kubelet: DraKubelet,
                                              preparer: ScriptedPreparer) -> None:
    assert list(kubelet.prepare(DRIVER, []).claims) == []
    assert preparer.calls == []


# --- NodeUnprepareResources -----------------------------------------------------------------


def test_unprepare_answers_every_claim_with_its_own_error(
        registered: DraPluginServer, kubelet: DraKubelet, preparer: ScriptedPreparer) -> None:
    preparer.unprepared = {
        A.name: None,
        B.name: "MIG device gpu-1-mig-3g-40gb-4 still has processes; left in place",
        C.name: OSError("CDI spec /var/run/cdi/tessera.json is read-only"),
    }
    response = kubelet.unprepare(DRIVER, [A, B, C])

    assert preparer.calls == [("unprepare", A), ("unprepare", B), ("unprepare", C)]
    assert {uid: r.error for uid, r in response.claims.items()} == {
        A.uid: "",
        B.uid: "MIG device gpu-1-mig-3g-40gb-4 still has processes; left in place",
        C.uid: "CDI spec /var/run/cdi/tessera.json is read-only",
    }
    assert dra_response_error("NodeUnprepareResources", [A], kubelet.unprepare(DRIVER, [A])) \
        is None


# --- sockets: start and stop ----------------------------------------------------------------


def _leave_stale_socket(path: Path) -> None:
    """What a killed driver leaves behind: a socket file nobody listens on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return False
    return True


def test_stale_sockets_from_a_killed_driver_are_replaced_on_start(
        registry_dir: Path, driver_dir: Path, preparer: ScriptedPreparer,
        kubelet: DraKubelet) -> None:
    server = DraPluginServer(DRIVER, preparer, plugins_registry_dir=registry_dir,
                             plugin_dir=driver_dir)
    stale = [Path(server.registration_socket), Path(server.endpoint)]
    for path in stale:
        _leave_stale_socket(path)
        assert not _listening(path)

    with server:
        assert all(_listening(path) for path in stale)
        kubelet.wait_for_driver(DRIVER, WAIT)
        preparer.prepared = {A.name: PreparedClaim((mig_1g(),))}
        assert kubelet.prepare(DRIVER, [A]).claims[A.uid].devices


def test_start_never_deletes_a_file_that_is_not_a_socket(
        registry_dir: Path, driver_dir: Path, preparer: ScriptedPreparer) -> None:
    server = DraPluginServer(DRIVER, preparer, plugins_registry_dir=registry_dir,
                             plugin_dir=driver_dir)
    driver_dir.mkdir(parents=True)
    Path(server.endpoint).write_text("not a socket")
    with pytest.raises(FileExistsError):
        server.start()
    assert Path(server.endpoint).read_text() == "not a socket"
    assert not Path(server.registration_socket).exists()  # nothing advertised
    assert not server.serving


def test_stop_removes_both_sockets_and_the_kubelet_deregisters_the_driver(
        registered: DraPluginServer, kubelet: DraKubelet) -> None:
    registered.stop()

    assert not os.path.exists(registered.registration_socket)
    assert not os.path.exists(registered.endpoint)
    assert not registered.registered
    assert kubelet.sync() == []
    assert kubelet.drivers() == {}
    with pytest.raises(AdmissionError, match=f"DRA driver {DRIVER} is not registered"):
        kubelet.prepare(DRIVER, [A])


def test_a_restarted_driver_is_registered_again(registered: DraPluginServer,
                                                kubelet: DraKubelet,
                                                preparer: ScriptedPreparer) -> None:
    registered.stop()
    registered.start()
    assert registered.notifications == 0  # a fresh start waits for a fresh verdict

    [attempt] = kubelet.sync()  # the replaced socket is a new plugin to the watcher
    assert attempt.accepted
    assert registered.registered
    preparer.prepared = {A.name: PreparedClaim((mig_1g(),))}
    assert kubelet.prepare(DRIVER, [A]).claims[A.uid].devices


@pytest.mark.parametrize("name", ["", "gpu/tessera.dev", "-gpu.tessera.dev", "gpu_tessera.dev",
                                  "g" * 64])
def test_a_driver_name_the_api_server_would_refuse_is_refused_at_construction(
        name: str, preparer: ScriptedPreparer) -> None:
    with pytest.raises(InvalidInputError, match="driver_name"):
        DraPluginServer(name, preparer)


def test_socket_paths_too_long_to_bind_are_refused_at_construction(
        preparer: ScriptedPreparer) -> None:
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        DraPluginServer(DRIVER, preparer, plugins_registry_dir="/tmp/" + "r" * 100)


# --- the stand-in holds the kubelet's rules -------------------------------------------------


class ScriptedRegistrar:
    """A registration socket whose GetInfo the test chooses; records what the kubelet says."""

    def __init__(self, path: Path, info: reg.PluginInfo) -> None:
        self.info = info
        self.statuses: list[tuple[bool, str]] = []
        self.release = threading.Event()
        self.release.set()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        _wire.add_plugin_registration_servicer(self, self._server)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._server.add_insecure_port(_wire.unix_target(path))
        self._server.start()

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        self.release.wait(WAIT)
        return self.info

    def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        self.statuses.append((request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)


@pytest.fixture
def scripted(registry_dir: Path) -> Iterator[ScriptedRegistrar]:
    registrar = ScriptedRegistrar(registry_dir / "example-reg.sock",
                                  reg.PluginInfo(type="DRAPlugin", name="example.com",
                                                 supported_versions=["v1.DRAPlugin"]))
    yield registrar
    registrar.release.set()
    registrar.stop()


def test_the_stand_in_refuses_a_plugin_type_it_has_no_handler_for(
        scripted: ScriptedRegistrar, kubelet: DraKubelet, registry_dir: Path) -> None:
    scripted.info.type = "CSIPlugin"
    [attempt] = kubelet.sync()
    assert scripted.statuses == [(False, "RegisterPlugin error -- no handler registered for "
                                  f"plugin type: CSIPlugin at socket {attempt.socket_path}")]


def test_the_stand_in_takes_an_empty_endpoint_as_the_registration_socket(
        scripted: ScriptedRegistrar, kubelet: DraKubelet) -> None:
    [attempt] = kubelet.sync()
    assert attempt.accepted
    assert attempt.endpoint == attempt.socket_path
    assert scripted.statuses == [(True, "")]


def test_the_stand_in_chooses_the_first_service_it_speaks_in_the_plugins_order(
        scripted: ScriptedRegistrar, kubelet: DraKubelet) -> None:
    scripted.info.supported_versions[:] = ["v1alpha4.DRAPlugin", "v1beta1.DRAPlugin",
                                           "v1.DRAPlugin"]
    [attempt] = kubelet.sync()
    assert attempt.service == "v1beta1.DRAPlugin"


def test_the_stand_in_gives_up_on_a_slow_get_info_without_notifying(
        scripted: ScriptedRegistrar, registry_dir: Path) -> None:
    scripted.release.clear()
    with DraKubelet(registry_dir, get_info_timeout=0.2) as impatient:
        [attempt] = impatient.sync()
    scripted.release.set()
    assert not attempt.accepted
    assert not attempt.notified
    assert "DeadlineExceeded" in (attempt.error or "")
    assert scripted.statuses == []


def test_the_stand_in_ignores_hidden_sockets_and_other_files(registry_dir: Path,
                                                             kubelet: DraKubelet) -> None:
    _leave_stale_socket(registry_dir / ".hidden-reg.sock")
    (registry_dir / "notes.txt").write_text("not a socket")
    assert kubelet.sockets() == []


def test_the_kubelet_rejects_a_response_that_skips_a_claim() -> None:
    response = dra.NodePrepareResourcesResponse()
    response.claims[A.uid].CopyFrom(dra.NodePrepareResourceResponse())
    assert dra_response_error("NodePrepareResources", [A, B], response) == \
        "NodePrepareResources skipped 1 ResourceClaims"
    response.claims["someone-else"].CopyFrom(dra.NodePrepareResourceResponse())
    assert dra_response_error("NodePrepareResources", [A], response) == \
        "NodePrepareResources returned result for unknown claim UID someone-else"
