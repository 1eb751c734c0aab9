"""MPS control daemon lifecycle, against the stand-in ``nvidia-cuda-mps-control``.

Every test runs real daemons (double-forked processes listening on the pipe directory), so what
is checked is what the manager did to them: processes that run or are gone, the environment they
got, the commands their control.log recorded, the files left under the root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tessera.agent.apply import run_step
from tessera.agent.mps import MpsError, MpsManager
from tessera.agent.reconcile import StartMps, StopMps
from tessera.agent.reconciler import Reconciler
from tessera.api.v1alpha1 import GpuSpec, MpsSpec, NodePartition, SliceSpec
from tessera.core.errors import InvalidInputError
from tessera.testing import Container, Pod, mps_control
from tessera.testing.mps_control import (
    ALREADY_RUNNING,
    REGISTRY_ENV,
    kill_registered,
    recorded_commands,
)

from .conftest import AgentNode, partition

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"


def settings_commands(uuid: str, threads: int, mib: int) -> list[str]:
    return [f"set_default_active_thread_percentage {threads}",
            f"set_default_device_pinned_mem_limit {uuid} {mib}M",
            "get_default_active_thread_percentage",
            f"get_default_device_pinned_mem_limit {uuid}"]


def dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_dead(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not dead(pid):
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.01)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@dataclass
class StandIn:
    bin: Path
    env: dict[str, str]
    root: Path

    def control(self, uuid: str, *commands: str, args: tuple[str, ...] = ()) -> \
            subprocess.CompletedProcess[str]:
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=str(self.root / uuid / "pipe"),
                   CUDA_MPS_LOG_DIRECTORY=str(self.root / uuid / "log"))
        return subprocess.run([str(self.bin), *args], input="".join(c + "\n" for c in commands),
                              env=env, capture_output=True, text=True, timeout=10, check=False)

    def commands(self, uuid: str) -> list[str]:
        return recorded_commands(self.root / uuid / "log")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    """The stand-in on PATH, a short root (Unix socket paths), and no daemon left afterwards."""
    binary = mps_control.install(tmp_path / "bin")
    registry = tmp_path / "daemons"
    root = Path(tempfile.mkdtemp(prefix="ts-mps-", dir="/tmp"))
    env = dict(os.environ, PATH=f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env[REGISTRY_ENV] = str(registry)
    try:
        yield StandIn(binary, env, root)
    finally:
        kill_registered(registry)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def manager(standin: StandIn) -> MpsManager:
    return MpsManager(standin.root, env=standin.env, timeout_s=5.0)


def step(uuid: str = GPU0, gpu: int = 0, shares: int = 4, threads: int = 25,
         mib: int = 10240) -> StartMps:
    return StartMps(gpu, uuid, shares, threads, mib)


# -- start ----------------------------------------------------------------------------------


def test_start_runs_one_daemon_per_device_with_its_own_pipe_log_and_device(
        manager: MpsManager, standin: StandIn) -> None:
    manager.start(step(GPU0, 0))
    manager.start(step(GPU1, 1, shares=2, threads=50, mib=20000))

    pids = {uuid: manager.pid(uuid) for uuid in (GPU0, GPU1)}
    assert None not in pids.values()
    assert len(set(pids.values())) == 2
    for uuid, pid in pids.items():
        assert pid is not None
        pipe = standin.root / uuid / "pipe"
        assert (pipe / "nvidia-cuda-mps-control.pid").read_text().strip() == str(pid)
        assert (pipe / "control").is_socket()
        env = environ(pid)
        assert env["CUDA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
        assert env["CUDA_MPS_LOG_DIRECTORY"] == str(standin.root / uuid / "log")
    assert standin.commands(GPU0) == settings_commands(GPU0, 25, 10240)
    assert standin.commands(GPU1) == settings_commands(GPU1, 50, 20000)


def test_settings_reach_the_daemon_and_are_reported(manager: MpsManager,
                                                    standin: StandIn) -> None:
    manager.start(step(shares=4, threads=25, mib=10240))

    replies = standin.control(GPU0, "get_default_active_thread_percentage",
                              f"get_default_device_pinned_mem_limit {GPU0}")
    assert replies.stdout.split() == ["25.0", "10240M"]
    status = manager.status()[GPU0]
    assert (status.daemon, status.shares, status.thread_percentage, status.memory_mi_b) == \
        ("Running", 4, 25, 10240)
    assert status.pipe_directory == str(standin.root / GPU0 / "pipe")
    advert = manager.adverts()[GPU0]
    assert advert.shares == 4
    assert advert.share.pipe_directory == str(standin.root / GPU0 / "pipe")
    assert (advert.share.pinned_memory_mib, advert.share.active_thread_percentage) == (10240, 25)
    assert advert.share.shm_directory is None


def test_shm_directory_is_handed_to_containers(standin: StandIn) -> None:
    manager = MpsManager(standin.root, env=standin.env, shm_directory=standin.root / "shm")
    manager.start(step())
    assert manager.adverts()[GPU0].share.shm_directory == str(standin.root / "shm")


def test_starting_a_running_daemon_with_the_same_settings_does_nothing(
        manager: MpsManager, standin: StandIn) -> None:
    manager.start(step())
    pid = manager.pid(GPU0)
    manager.start(step())
    assert manager.pid(GPU0) == pid
    assert standin.commands(GPU0) == settings_commands(GPU0, 25, 10240)


def test_other_settings_restart_the_daemon(manager: MpsManager, standin: StandIn) -> None:
    manager.start(step(threads=25, mib=10240))
    old = manager.pid(GPU0)
    assert old is not None

    manager.start(step(shares=2, threads=50, mib=20480))

    assert dead(old)
    assert manager.pid(GPU0) not in (None, old)
    assert standin.commands(GPU0) == [*settings_commands(GPU0, 25, 10240),
                                      "get_server_list", "quit",
                                      *settings_commands(GPU0, 50, 20480)]
    assert manager.status()[GPU0].shares == 2
    assert manager.restarts() == {GPU0: 0}  # asked for, not a crash


def test_no_restart_for_new_settings_while_a_server_runs(manager: MpsManager,
                                                         standin: StandIn) -> None:
    manager.start(step(threads=25))
    pid = manager.pid(GPU0)
    assert standin.control(GPU0, "start_server -uid 1000").returncode == 0

    with pytest.raises(MpsError, match=r"server\(s\) \d+; its limits change only once"):
        manager.start(step(threads=50))

    assert manager.pid(GPU0) == pid
    assert manager.status()[GPU0].thread_percentage == 25


def test_a_second_daemon_on_the_same_pipe_directory_is_refused(manager: MpsManager,
                                                               standin: StandIn) -> None:
    manager.start(step())
    second = standin.control(GPU0, args=("-d",))
    assert second.returncode == 1
    assert ALREADY_RUNNING in second.stdout


# -- stop -----------------------------------------------------------------------------------


def test_stop_quits_waits_for_exit_and_removes_the_directories(manager: MpsManager,
                                                               standin: StandIn) -> None:
    manager.start(step())
    pid = manager.pid(GPU0)
    assert pid is not None
    with (standin.root / GPU0 / "log" / "control.log").open() as log:  # readable once removed
        manager.stop(StopMps(0, GPU0))
        recorded = log.read()

    assert dead(pid)  # stop returns only once the daemon has exited
    assert [line.split("] Cmd:")[1] for line in recorded.splitlines()
            if "] Cmd:" in line][-1] == "quit"
    assert not (standin.root / GPU0).exists()
    assert manager.status() == {}
    assert manager.adverts() == {}


def test_stop_is_idempotent(manager: MpsManager, standin: StandIn) -> None:
    manager.stop(StopMps(0, GPU0))  # never started
    manager.start(step())
    manager.stop(StopMps(0, GPU0))
    manager.stop(StopMps(0, GPU0))
    assert list(standin.root.iterdir()) == []


# -- crash, restart, adoption ---------------------------------------------------------------


def test_a_killed_daemon_is_restarted_by_check_with_its_settings(manager: MpsManager,
                                                                 standin: StandIn) -> None:
    manager.start(step(threads=25, mib=10240))
    old = manager.pid(GPU0)
    assert old is not None
    assert manager.check() == []

    os.kill(old, signal.SIGKILL)
    wait_dead(old)

    assert manager.status()[GPU0].daemon == "Starting"
    assert manager.adverts() == {}  # no pipe without a daemon behind it
    assert manager.check() == [GPU0]

    new = manager.pid(GPU0)
    assert new not in (None, old)
    assert environ(new or 0)["CUDA_VISIBLE_DEVICES"] == GPU0
    assert standin.commands(GPU0) == settings_commands(GPU0, 25, 10240) * 2
    assert standin.control(GPU0, "get_default_active_thread_percentage").stdout == "25.0\n"
    assert manager.status()[GPU0].daemon == "Running"
    assert GPU0 in manager.adverts()
    assert manager.restarts() == {GPU0: 1}
    assert manager.check() == []


def test_a_failing_restart_is_failed_and_retried_with_backoff(standin: StandIn) -> None:
    now = [100.0]
    manager = MpsManager(standin.root, env=standin.env, timeout_s=5.0, backoff_s=(1.0, 60.0),
                         clock=lambda: now[0])
    manager.start(step())
    pid = manager.pid(GPU0)
    assert pid is not None
    standin.bin.rename(standin.bin.with_name("hidden"))
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)

    assert manager.check() == []
    assert manager.status()[GPU0].daemon == "Failed"
    assert "nvidia-cuda-mps-control" in manager.errors()[GPU0]
    standin.bin.with_name("hidden").rename(standin.bin)
    now[0] += 0.5
    assert manager.check() == []  # still backing off
    now[0] += 0.6
    assert manager.check() == [GPU0]
    assert manager.status()[GPU0].daemon == "Running"
    assert manager.errors() == {}


def test_an_agent_restart_adopts_running_daemons_without_touching_them(
        manager: MpsManager, standin: StandIn) -> None:
    manager.start(step(GPU0, 0))
    manager.start(step(GPU1, 1, shares=2, threads=50, mib=20480))
    pids = {uuid: manager.pid(uuid) for uuid in (GPU0, GPU1)}
    before = {uuid: standin.commands(uuid) for uuid in (GPU0, GPU1)}
    del manager  # the agent exits; its daemons do not

    restarted = MpsManager(standin.root, env=standin.env, timeout_s=5.0)
    assert restarted.recover() == sorted([GPU0, GPU1])

    assert {uuid: restarted.pid(uuid) for uuid in (GPU0, GPU1)} == pids
    assert {uuid: standin.commands(uuid) for uuid in (GPU0, GPU1)} == before
    assert restarted.status()[GPU1].shares == 2
    assert restarted.adverts()[GPU1].share.active_thread_percentage == 50
    restarted.start(step(GPU0, 0))  # the reconcile's StartMps finds it as wanted
    assert restarted.pid(GPU0) == pids[GPU0]
    assert restarted.check() == []
    assert standin.commands(GPU0) == before[GPU0]


def test_a_daemon_that_died_while_the_agent_was_down_is_restarted(
        manager: MpsManager, standin: StandIn) -> None:
    manager.start(step())
    pid = manager.pid(GPU0)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)

    restarted = MpsManager(standin.root, env=standin.env, timeout_s=5.0)
    assert restarted.recover() == [GPU0]
    assert restarted.status()[GPU0].daemon == "Starting"
    assert restarted.check() == [GPU0]
    assert restarted.pid(GPU0) not in (None, pid)
    assert restarted.restarts() == {GPU0: 1}


def test_start_adopts_a_daemon_it_did_not_know_about(manager: MpsManager,
                                                     standin: StandIn) -> None:
    manager.start(step())
    pid = manager.pid(GPU0)
    other = MpsManager(standin.root, env=standin.env, timeout_s=5.0)  # no recover()
    other.start(step())
    assert other.pid(GPU0) == pid
    assert standin.commands(GPU0) == settings_commands(GPU0, 25, 10240)


# -- bad input and the step runner ------------------------------------------------------------


@pytest.mark.parametrize(("bad", "field"), [
    (StartMps(0, GPU0, 0, 25, 1024), "mps.shares"),
    (StartMps(0, GPU0, 2, 0, 1024), "mps.threadPercentage"),
    (StartMps(0, GPU0, 2, 50, 0), "mps.memoryMiB"),
    (StartMps(0, "GPU-../../etc", 2, 50, 1024), "mps.uuid"),
])
def test_bad_settings_are_refused_before_anything_is_created(
        manager: MpsManager, standin: StandIn, bad: StartMps, field: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        manager.start(bad)
    assert error.value.field == field
    assert list(standin.root.iterdir()) == []


def test_a_missing_binary_names_it_and_the_fix(standin: StandIn) -> None:
    manager = MpsManager(standin.root, "no-such-mps-control", env=standin.env)
    with pytest.raises(MpsError, match=r"'no-such-mps-control': not found .*--mps-control"):
        manager.start(step())
    assert list(standin.root.iterdir()) == []
    outcome = run_step(None, None, manager, step())  # type: ignore[arg-type]
    assert outcome.status == "failed"
    assert "no-such-mps-control" in outcome.message


def test_the_step_runner_drives_the_manager(manager: MpsManager, standin: StandIn) -> None:
    assert run_step(None, None, manager, step()).ok  # type: ignore[arg-type]
    assert manager.pid(GPU0) is not None
    assert run_step(None, None, manager, StopMps(0, GPU0)).ok  # type: ignore[arg-type]
    assert not (standin.root / GPU0).exists()


@pytest.mark.parametrize(("root", "problem"), [
    (Path("relative/mps"), "absolute"),
    (Path("/" + "r" * 60), "107-byte Unix socket limit"),
])
def test_unusable_roots_are_refused(root: Path, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        MpsManager(root)


# -- the stand-in itself ---------------------------------------------------------------------


def test_the_stand_in_answers_like_the_control_client(manager: MpsManager,
                                                      standin: StandIn) -> None:
    manager.start(step())
    done = standin.control(GPU0, "get_server_list", "start_server -uid 1000", "get_server_list",
                           "set_default_active_thread_percentage 250", "no_such_command")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].isdigit()
    assert lines[1] == "Invalid active thread percentage: 250"
    assert lines[2] == "Unrecognized command: no_such_command"
    assert standin.commands(GPU0)[-5:] == ["get_server_list", "start_server -uid 1000",
                                           "get_server_list",
                                           "set_default_active_thread_percentage 250",
                                           "no_such_command"]


def test_the_stand_in_client_without_a_daemon_fails(standin: StandIn) -> None:
    done = standin.control(GPU0, "get_server_list")
    assert done.returncode == 1
    assert "Cannot find MPS control daemon" in done.stderr


def test_a_gpu_in_mps_mode_runs_a_daemon_and_advertises_its_shares(
    agent_node: AgentNode, manager: MpsManager,
) -> None:
    """End to end on the agent: spec mode mps -> daemon started -> shares on ListAndWatch."""
    reconciler = Reconciler(agent_node.runtime, manager)
    spec = partition(GpuSpec(index=2, mode="mps", mps=MpsSpec(shares=4)))
    result = reconciler.reconcile(spec)
    applied = next(c for c in result.status.conditions if c.type == "Applied")
    assert applied.status == "True", applied.message
    observed = result.status.gpus[2]
    assert observed.mode == "mps"
    assert observed.mps is not None
    assert (observed.mps.shares, observed.mps.daemon) == (4, "Running")
    agent_node.kubelet.wait_until(
        lambda k: k.allocatable().get("nvidia.com/gpu.shared") == 4, timeout=10,
        what="four MPS shares advertised")
    pod = Pod("ml", "small", (Container("main", {"nvidia.com/gpu.shared": 1}),))
    agent_node.kubelet.admit(pod)
    envs = agent_node.kubelet.run_options(pod, "main").envs
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == observed.mps.pipe_directory
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    back = reconciler.reconcile(partition(GpuSpec(index=2, mode="none"), generation=2))
    blocked = next(c for c in back.status.conditions if c.type == "Blocked")
    assert "runs MPS for ml/small" in blocked.message, "a held share keeps the daemon"
    agent_node.kubelet.remove_pod(pod.uid)
    done = reconciler.reconcile(partition(GpuSpec(index=2, mode="none"), generation=2))
    assert next(c for c in done.status.conditions if c.type == "Applied").status == "True"
    assert manager.status() == {}


@pytest.mark.parametrize("agent_node", [["L4-24GB", "T4-16GB"]], indirect=True)
def test_mps_shares_a_gpu_without_mig_with_per_share_limits(
    agent_node: AgentNode, manager: MpsManager,
) -> None:
    """An L4 has no MIG: six MPS shares, each with its thread and pinned-memory limits."""
    reconciler = Reconciler(agent_node.runtime, manager)
    too_big = reconciler.reconcile(partition(
        GpuSpec(index=0, mode="mps", mps=MpsSpec(shares=6, memory_mi_b=4096))))
    invalid = next(c for c in too_big.status.conditions if c.type == "Invalid")
    assert invalid.status == "True"
    assert "spec.gpus[0].mps.memoryMiB: 6 shares x 4096 MiB exceed GPU 0's 23034 MiB" in (
        invalid.message)
    result = reconciler.reconcile(partition(
        GpuSpec(index=0, mode="mps", mps=MpsSpec(shares=6, thread_percentage=16,
                                                  memory_mi_b=3800)), generation=2))
    applied = next(c for c in result.status.conditions if c.type == "Applied")
    assert applied.status == "True", applied.message
    assert result.status.gpus[0].name == "NVIDIA L4"
    agent_node.kubelet.wait_until(
        lambda k: k.allocatable().get("nvidia.com/gpu.shared") == 6, timeout=10,
        what="six MPS shares on the L4")
    assert agent_node.kubelet.allocatable().get("nvidia.com/gpu") == 1, "the T4 stays whole"
    pod = Pod("ml", "infer", (Container("main", {"nvidia.com/gpu.shared": 1}),))
    agent_node.kubelet.admit(pod)
    envs = agent_node.kubelet.run_options(pod, "main").envs
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "16"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=3800M")


def _mig_with_inner_mps(mps: MpsSpec | None, generation: int = 1) -> NodePartition:
    return partition(GpuSpec(index=0, mode="mig", slices=[
        SliceSpec(profile="2g.20gb", start=0), SliceSpec(profile="1g.10gb", start=2),
        SliceSpec(profile="3g.40gb", start=4, mps=mps)]), generation=generation)


def test_mps_inside_a_mig_slice_shares_it_beside_plain_slices(
    agent_node: AgentNode, manager: MpsManager,
) -> None:
    """A 3g.40gb runs its own MPS daemon; its shares are nvidia.com/mig-3g.40gb.shared."""
    reconciler = Reconciler(agent_node.runtime, manager)
    result = reconciler.reconcile(_mig_with_inner_mps(MpsSpec(shares=3)))
    applied = next(c for c in result.status.conditions if c.type == "Applied")
    assert applied.status == "True", applied.message
    inner = next(s for s in result.status.gpus[0].slices if s.profile == "3g.40gb")
    assert inner.mps is not None
    assert (inner.mps.shares, inner.mps.daemon, inner.mps.memory_mi_b) == (3, "Running", 13397)
    shared = "nvidia.com/mig-3g.40gb.shared"
    agent_node.kubelet.wait_until(
        lambda k: k.allocatable().get(shared) == 3
        and k.allocatable().get("nvidia.com/mig-2g.20gb") == 1
        and k.allocatable().get("nvidia.com/mig-1g.10gb") == 1
        and not k.allocatable().get("nvidia.com/mig-3g.40gb"), timeout=10,
        what="three shares of the 3g.40gb beside the plain slices")
    assert sorted(agent_node.kubelet.devices(shared)) == [f"{inner.uuid}::{n}" for n in range(3)]
    pod = Pod("ml", "inner", (Container("main", {shared: 1}),))
    agent_node.kubelet.admit(pod)
    envs = agent_node.kubelet.run_options(pod, "main").envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == inner.uuid
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == inner.mps.pipe_directory
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    plain = reconciler.reconcile(_mig_with_inner_mps(None, generation=2))
    blocked = next(c for c in plain.status.conditions if c.type == "Blocked")
    assert f"3g.40gb@4 ({inner.uuid}) on GPU 0 runs MPS for ml/inner" in blocked.message
    agent_node.kubelet.remove_pod(pod.uid)
    plain = reconciler.reconcile(_mig_with_inner_mps(None, generation=2))
    assert next(c for c in plain.status.conditions if c.type == "Applied").status == "True"
    assert manager.status() == {}
    agent_node.kubelet.wait_until(
        lambda k: k.allocatable().get("nvidia.com/mig-3g.40gb") == 1
        and not k.allocatable().get(shared), timeout=10, what="the slice itself again")
    assert {s.uuid for s in plain.status.gpus[0].slices} >= {inner.uuid}, "the slice was kept"


def test_a_slice_running_mps_is_destroyed_only_after_its_daemon_stops(
    agent_node: AgentNode, manager: MpsManager,
) -> None:
    reconciler = Reconciler(agent_node.runtime, manager)
    reconciler.reconcile(_mig_with_inner_mps(MpsSpec(shares=2)))
    assert len(manager.status()) == 1
    whole = reconciler.reconcile(partition(GpuSpec(index=0, mode="mig", slices=[
        SliceSpec(profile="7g.80gb", start=0)]), generation=2))
    assert next(c for c in whole.status.conditions if c.type == "Applied").status == "True"
    kinds = [type(step).__name__ for step in whole.done]
    assert kinds.index("StopMps") < kinds.index("DestroySlice")
    assert manager.status() == {}
    assert [s.profile for s in whole.status.gpus[0].slices] == ["7g.80gb"]


def test_shares_of_a_slice_cannot_ask_for_more_than_its_memory(
    agent_node: AgentNode, manager: MpsManager,
) -> None:
    reconciler = Reconciler(agent_node.runtime, manager)
    result = reconciler.reconcile(_mig_with_inner_mps(MpsSpec(shares=3, memory_mi_b=20000)))
    invalid = next(c for c in result.status.conditions if c.type == "Invalid")
    assert invalid.status == "True"
    assert ("spec.gpus[0].slices[2].mps.memoryMiB: 3 shares x 20000 MiB exceed 3g.40gb's "
            "40192 MiB") in invalid.message


@pytest.mark.parametrize("agent_node", [["L4-24GB"]], indirect=True)
def test_memory_sized_shares_are_advertised_under_their_own_resource(
    agent_node: AgentNode, manager: MpsManager,
) -> None:
    reconciler = Reconciler(agent_node.runtime, manager)
    sized = MpsSpec.model_validate({"shares": 2, "memoryMiB": 8192,
                                    "resource": "nvidia.com/gpu.shared-8gb"})
    result = reconciler.reconcile(partition(GpuSpec(index=0, mode="mps", mps=sized)))
    assert next(c for c in result.status.conditions if c.type == "Applied").status == "True"
    assert result.status.gpus[0].mps is not None
    assert result.status.gpus[0].mps.resource == "nvidia.com/gpu.shared-8gb"
    agent_node.kubelet.wait_until(
        lambda k: k.allocatable().get("nvidia.com/gpu.shared-8gb") == 2
        and not k.allocatable().get("nvidia.com/gpu.shared"), timeout=10,
        what="two 8 GiB shares")
    pod = Pod("ml", "eight", (Container("main", {"nvidia.com/gpu.shared-8gb": 1}),))
    agent_node.kubelet.admit(pod)
    envs = agent_node.kubelet.run_options(pod, "main").envs
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=8192M")
