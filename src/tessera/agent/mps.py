"""MPS control daemons, one per GPU (or MIG device) in MPS mode: start, configure, watch, adopt.

Why one daemon per device: the MPS limits Tessera hands out (a share's SM percentage and pinned
memory) are *daemon-wide defaults* that NVIDIA's device plugin does not set per container, and
on MIG each device needs its own daemon anyway. So every device gets its own directories under a
configurable root::

    <root>/<uuid>/pipe     CUDA_MPS_PIPE_DIRECTORY: the control socket and pid file; containers
                           mount it at the same path
    <root>/<uuid>/log      CUDA_MPS_LOG_DIRECTORY: control.log and server.log
    <root>/<uuid>/tessera-mps.json   the settings the daemon was started with

and is started as ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES=<uuid>`` (a UUID,
not an index: the variable remaps ordinals for clients, and NVIDIA's plugin leaving it unset is
a known gap). The limits are then set through the control pipe, as NVIDIA's plugin does::

    set_default_active_thread_percentage <pct>
    set_default_device_pinned_mem_limit <uuid> <MiB>M

and read back (``get_default_*``), which doubles as the health probe NVIDIA's plugin uses.
Defaults only reach MPS servers started afterwards, which is why changing them means restarting
the daemon, and why that restart is refused while the daemon has servers (clients would lose
their GPU context).

The agent must be able to restart without cutting running MPS clients off, so nothing here
depends on the daemon being the agent's child: the daemon daemonizes, its identity is the pid
file it writes, and :meth:`MpsManager.recover` adopts what is already running under the root.
:meth:`MpsManager.check`, called every agent tick, restarts a daemon that died and re-applies
its settings, backing off while restarts fail.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tessera.agent.advertising import MpsAdvert
from tessera.agent.reconcile import StartMps, StopMps
from tessera.api.v1alpha1 import MpsStatus
from tessera.core.catalogue import MPS_SHARED_RESOURCE
from tessera.core.errors import BackendError, InvalidInputError
from tessera.kubelet.inventory import MpsShare

__all__ = ["DEFAULT_CONTROL_BINARY", "DeviceDirectories", "MpsError", "MpsManager", "MpsSettings"]

log = logging.getLogger(__name__)

DEFAULT_CONTROL_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
SETTINGS_FILE = "tessera-mps.json"
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z-]*$")
_UUID_LENGTH = 40  # "GPU-" / "MIG-" and a 36-character UUID
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL
_SOCKET_SUFFIX = "/pipe/control"
_MEMORY_REPLY = re.compile(r"^(\d+(?:\.\d+)?)\s*([MG])i?B?$")

DaemonState = Literal["Running", "Starting", "Failed"]


class MpsError(BackendError):
    """An MPS control daemon that could not be started, configured, reached or stopped.

    A :class:`BackendError`, so the step runner records it as a failed step and the next
    reconcile tries again.
    """


@dataclass(frozen=True)
class MpsSettings:
    """What one device's daemon runs with; persisted beside it so a restarted agent knows."""

    gpu: int
    uuid: str
    shares: int
    thread_percentage: int
    memory_mib: int
    resource: str = MPS_SHARED_RESOURCE
    """What the shares are advertised as (whole GPUs: plain or memory-sized)."""

    @classmethod
    def from_step(cls, step: StartMps) -> MpsSettings:
        settings = cls(step.gpu, step.uuid, step.shares, step.thread_percentage,
                       step.memory_mib, step.resource)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Refuse what would reach the daemon as nonsense, naming the field."""
        if not _UUID.match(self.uuid):
            raise InvalidInputError("mps.uuid", f"{self.uuid!r} is not a GPU-... or MIG-... UUID")
        if self.shares < 1:
            raise InvalidInputError("mps.shares", f"must be at least 1, got {self.shares}")
        if not 1 <= self.thread_percentage <= 100:
            raise InvalidInputError("mps.threadPercentage",
                                    f"must be within 1..100, got {self.thread_percentage}")
        if self.memory_mib < 1:
            raise InvalidInputError("mps.memoryMiB", f"must be positive, got {self.memory_mib}")

    def to_json(self) -> str:
        return json.dumps({"gpu": self.gpu, "uuid": self.uuid, "shares": self.shares,
                           "threadPercentage": self.thread_percentage,
                           "memoryMiB": self.memory_mib, "resource": self.resource},
                          indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> MpsSettings:
        raw = json.loads(text)
        settings = cls(int(raw["gpu"]), str(raw["uuid"]), int(raw["shares"]),
                       int(raw["threadPercentage"]), int(raw["memoryMiB"]),
                       str(raw.get("resource", MPS_SHARED_RESOURCE)))
        settings.validate()
        return settings


@dataclass
class _Daemon:
    settings: MpsSettings
    pid: int | None = None
    started: int | None = None
    """The process's start time (clock ticks since boot), so a reused pid is not taken for it."""
    state: DaemonState = "Starting"
    error: str = ""
    restarts: int = 0
    failures: int = 0
    retry_at: float = 0.0


def _process_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def _alive(pid: int | None, started: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie: nobody may reap an orphaned daemon) and is still ours."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@dataclass
class DeviceDirectories:
    """Where one device's daemon keeps its files, all under ``<root>/<uuid>``."""

    device: Path
    pipe: Path
    log: Path
    settings: Path
    pid_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.pid_file = self.pipe / PID_FILE


class MpsManager:
    """Runs the MPS control daemons of this node; the agent's :class:`MpsControl`.

    ``control_binary`` is a name looked up on ``env``'s PATH or a path; ``env`` is the
    environment the daemon and its client get (the agent's own by default), to which the MPS
    variables are added. ``shm_directory``, if set, is handed to containers to mount at
    /dev/shm (NVIDIA's plugin uses ``<mpsRoot>/shm``, a tmpfs the node must provide).

    Thread-safe: the agent's reconcile and its tick may call in from different threads.
    """

    def __init__(self, root: Path, control_binary: str = DEFAULT_CONTROL_BINARY,
                 env: Mapping[str, str] | None = None, *,
                 shm_directory: Path | None = None, timeout_s: float = 10.0,
                 backoff_s: tuple[float, float] = (1.0, 60.0),
                 clock: Callable[[], float] = time.monotonic) -> None:
        root = Path(root)
        if not root.is_absolute():
            raise InvalidInputError("mps root", f"{str(root)!r} must be an absolute path, "
                                    "since containers mount the pipe directory at that path")
        longest = len(os.fsencode(root)) + 1 + _UUID_LENGTH + len(_SOCKET_SUFFIX)
        if longest > _SOCKET_PATH_MAX:
            raise InvalidInputError(
                "mps root", f"{str(root)!r} is too long: the control socket "
                f"<root>/<uuid>{_SOCKET_SUFFIX} would be {longest} bytes, over the "
                f"{_SOCKET_PATH_MAX}-byte Unix socket limit; use a shorter root such as "
                "/run/tessera/mps")
        if shm_directory is not None and not Path(shm_directory).is_absolute():
            raise InvalidInputError("mps shm directory", "must be an absolute host path")
        self.root = root
        self.control_binary = control_binary
        self.shm_directory = Path(shm_directory) if shm_directory is not None else None
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._env = dict(os.environ if env is None else env)
        self._clock = clock
        self._lock = threading.RLock()
        self._daemons: dict[str, _Daemon] = {}

    # -- paths and processes ------------------------------------------------------------------

    def directories(self, uuid: str) -> DeviceDirectories:
        if not _UUID.match(uuid):
            raise InvalidInputError("mps.uuid", f"{uuid!r} is not a GPU-... or MIG-... UUID")
        device = self.root / uuid
        return DeviceDirectories(device, device / "pipe", device / "log", device / SETTINGS_FILE)

    def binary(self) -> str:
        """The control binary's path; an :class:`MpsError` that says how to fix it if absent."""
        found = shutil.which(self.control_binary, path=self._env.get("PATH", os.defpath))
        if found is None:
            raise MpsError(
                "mps", f"cannot run {self.control_binary!r}: not found (PATH="
                f"{self._env.get('PATH', '')!r}); install the NVIDIA driver's CUDA MPS tools "
                "(nvidia-cuda-mps-control) on the node, or point the agent at it with "
                "--mps-control /path/to/nvidia-cuda-mps-control")
        return found

    def _daemon_env(self, uuid: str, dirs: DeviceDirectories) -> dict[str, str]:
        env = dict(self._env)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(dirs.pipe)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(dirs.log)
        env["CUDA_VISIBLE_DEVICES"] = uuid
        return env

    def _run(self, operation: str, uuid: str, args: list[str],
             commands: list[str] | None = None) -> list[str]:
        dirs = self.directories(uuid)
        try:
            done = subprocess.run(
                [self.binary(), *args], input="".join(c + "\n" for c in commands or []),
                env=self._daemon_env(uuid, dirs), capture_output=True, text=True,
                timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise MpsError(operation, f"{self.control_binary} {' '.join(args)} for {uuid} did "
                           f"not finish within {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise MpsError(operation, f"cannot run {self.control_binary!r}: {exc}") from exc
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            raise MpsError(operation, f"{self.control_binary} {' '.join(args)} for {uuid} "
                           f"exited with {done.returncode}: {output or 'no output'}")
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def _control(self, operation: str, uuid: str, commands: list[str]) -> list[str]:
        """``echo <commands> | nvidia-cuda-mps-control``: the replies, one a line."""
        return self._run(operation, uuid, [], commands)

    def _wait_gone(self, pid: int, started: int | None) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while _alive(pid, started):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -- starting -------------------------------------------------------------------------------

    def _launch(self, settings: MpsSettings) -> _Daemon:
        """Start a daemon and apply its settings; on any failure leave no daemon behind."""
        dirs = self.directories(settings.uuid)
        self.binary()  # fail before creating anything if it cannot run at all
        dirs.pipe.mkdir(parents=True, exist_ok=True)
        dirs.log.mkdir(parents=True, exist_ok=True)
        temporary = dirs.settings.with_suffix(".tmp")
        temporary.write_text(settings.to_json(), encoding="utf-8")
        temporary.replace(dirs.settings)  # written first: a running daemon always has one
        stale = _read_pid(dirs.pid_file)
        if stale is not None and not _alive(stale):
            with contextlib.suppress(FileNotFoundError):
                dirs.pid_file.unlink()
        self._run("mps start", settings.uuid, ["-d"])
        deadline = time.monotonic() + self.timeout_s
        pid = _read_pid(dirs.pid_file)
        while not _alive(pid):
            if time.monotonic() > deadline:
                raise MpsError("mps start", f"the daemon for {settings.uuid} wrote no live pid "
                               f"to {dirs.pid_file} within {self.timeout_s:g} s; see "
                               f"{dirs.log / 'control.log'}")
            time.sleep(0.01)
            pid = _read_pid(dirs.pid_file)
        assert pid is not None
        daemon = _Daemon(settings, pid, _process_start(pid))
        try:
            self._apply(settings)
        except MpsError:
            with contextlib.suppress(MpsError):  # the configure error is the one to report
                self._quit(daemon)
            raise
        daemon.state = "Running"
        log.info("MPS daemon %d for GPU %d (%s) runs with %d shares of %d%% and %d MiB",
                 pid, settings.gpu, settings.uuid, settings.shares, settings.thread_percentage,
                 settings.memory_mib)
        return daemon

    def _apply(self, settings: MpsSettings) -> None:
        """Set the defaults through the pipe and read them back."""
        uuid = settings.uuid
        replies = self._control("mps configure", uuid, [
            f"set_default_active_thread_percentage {settings.thread_percentage}",
            f"set_default_device_pinned_mem_limit {uuid} {settings.memory_mib}M",
            "get_default_active_thread_percentage",
            f"get_default_device_pinned_mem_limit {uuid}",
        ])
        if len(replies) < 2:
            raise MpsError("mps configure", f"the daemon for {uuid} did not answer the "
                           f"read-back (replies: {replies})")
        *extra, threads, memory = replies
        if extra:
            log.warning("MPS daemon for %s said while being configured: %s", uuid,
                        "; ".join(extra))
        try:
            applied = float(threads)
        except ValueError:
            applied = -1.0
        if applied != float(settings.thread_percentage):
            raise MpsError("mps configure", f"the daemon for {uuid} reports an active thread "
                           f"percentage of {threads!r}, not {settings.thread_percentage}"
                           + (f" ({'; '.join(extra)})" if extra else ""))
        match = _MEMORY_REPLY.match(memory)
        if match is None:
            log.warning("cannot read MPS pinned memory limit %r back for %s", memory, uuid)
            return
        mib = float(match.group(1)) * (1024 if match.group(2) == "G" else 1)
        if round(mib) != settings.memory_mib:
            raise MpsError("mps configure", f"the daemon for {uuid} reports a pinned memory "
                           f"limit of {memory!r}, not {settings.memory_mib}M")

    def start(self, step: StartMps) -> None:
        """Run a daemon with ``step``'s settings: nothing if it already does, else (re)start it.

        A daemon with other settings is restarted (new defaults only reach new servers), but not
        while it has servers, which would take their clients' GPU contexts with them.
        """
        settings = MpsSettings.from_step(step)
        with self._lock:
            daemon = self._daemons.get(settings.uuid) or self._find(settings.uuid)
            if daemon is not None and _alive(daemon.pid, daemon.started):
                if daemon.settings == settings and daemon.state == "Running":
                    self._daemons[settings.uuid] = daemon
                    return
                servers = self._control("mps start", settings.uuid, ["get_server_list"])
                if servers:
                    raise MpsError(
                        "mps start", f"GPU {settings.gpu} ({settings.uuid}) runs MPS with "
                        f"{daemon.settings.shares} shares and server(s) {', '.join(servers)}; "
                        "its limits change only once they have exited")
                self._quit(daemon)
            restarts = daemon.restarts if daemon is not None else 0
            try:
                fresh = self._launch(settings)
            except MpsError:
                self._daemons.pop(settings.uuid, None)
                raise
            fresh.restarts = restarts
            self._daemons[settings.uuid] = fresh

    def _find(self, uuid: str) -> _Daemon | None:
        """A daemon running under the root for ``uuid`` that this manager has not adopted."""
        dirs = self.directories(uuid)
        pid = _read_pid(dirs.pid_file)
        if not _alive(pid):
            return None
        assert pid is not None
        try:
            settings = MpsSettings.from_json(dirs.settings.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise MpsError("mps start", f"a daemon (pid {pid}) already runs in {dirs.pipe} "
                           f"but {dirs.settings} cannot be read ({exc}); stop it with "
                           f"'echo quit | CUDA_MPS_PIPE_DIRECTORY={dirs.pipe} "
                           f"{self.control_binary}'") from exc
        return _Daemon(settings, pid, _process_start(pid), state="Running")

    # -- stopping -------------------------------------------------------------------------------

    def _quit(self, daemon: _Daemon) -> None:
        """``echo quit``, then wait until the process is gone."""
        uuid = daemon.settings.uuid
        if not _alive(daemon.pid, daemon.started):
            return
        assert daemon.pid is not None
        try:
            self._control("mps stop", uuid, ["quit"])
        except MpsError:
            if _alive(daemon.pid, daemon.started):
                raise
        if not self._wait_gone(daemon.pid, daemon.started):
            raise MpsError("mps stop", f"the MPS daemon for {uuid} (pid {daemon.pid}) did not "
                           f"exit within {self.timeout_s:g} s of 'quit'; it is left running")

    def stop(self, step: StopMps) -> None:
        """Quit the device's daemon, wait for it to exit, remove its directories; idempotent."""
        with self._lock:
            dirs = self.directories(step.uuid)
            daemon = self._daemons.get(step.uuid)
            if daemon is None:
                pid = _read_pid(dirs.pid_file)
                if _alive(pid):
                    settings = MpsSettings(step.gpu, step.uuid, 1, 100, 1)
                    daemon = _Daemon(settings, pid, _process_start(pid) if pid else None)
            if daemon is not None:
                self._quit(daemon)
            self._daemons.pop(step.uuid, None)
            shutil.rmtree(dirs.device, ignore_errors=True)
            log.info("MPS stopped on GPU %d (%s)", step.gpu, step.uuid)

    # -- watching and adopting ------------------------------------------------------------------

    def check(self) -> list[str]:
        """Restart every daemon that died, re-applying its settings; the UUIDs restarted.

        Called every agent tick. A restart that fails is retried with exponential backoff
        (``backoff_s``: first delay, cap) and the daemon reports ``Failed`` meanwhile.
        """
        restarted = []
        with self._lock:
            now = self._clock()
            for uuid, daemon in list(self._daemons.items()):
                if _alive(daemon.pid, daemon.started):
                    continue
                if daemon.state == "Failed" and now < daemon.retry_at:
                    continue
                if daemon.state == "Running":
                    log.warning("MPS daemon for GPU %d (%s), pid %s, has died; restarting",
                                daemon.settings.gpu, uuid, daemon.pid)
                try:
                    fresh = self._launch(daemon.settings)
                except MpsError as exc:
                    daemon.state = "Failed"
                    daemon.pid = None
                    daemon.error = str(exc)
                    daemon.failures += 1
                    first, cap = self.backoff_s
                    daemon.retry_at = now + min(cap, first * 2 ** (daemon.failures - 1))
                    log.error("MPS daemon for %s could not be restarted (attempt %d): %s",
                              uuid, daemon.failures, exc)
                    continue
                fresh.restarts = daemon.restarts + 1
                self._daemons[uuid] = fresh
                restarted.append(uuid)
        return restarted

    def recover(self) -> list[str]:
        """Adopt the daemons already under the root (agent restart); the UUIDs adopted.

        A running daemon is taken over as it is: no command is sent, so its servers and their
        clients carry on. One whose process is gone is registered to be restarted by the next
        :meth:`check`. A directory without readable settings is left alone and logged.
        """
        adopted: list[str] = []
        with self._lock:
            if not self.root.is_dir():
                return adopted
            for device in sorted(self.root.iterdir()):
                if not device.is_dir() or not _UUID.match(device.name):
                    continue
                dirs = self.directories(device.name)
                try:
                    settings = MpsSettings.from_json(dirs.settings.read_text(encoding="utf-8"))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("not adopting MPS directory %s: %s", device, exc)
                    continue
                if settings.uuid != device.name:
                    log.warning("not adopting MPS directory %s: its settings are for %s",
                                device, settings.uuid)
                    continue
                pid = _read_pid(dirs.pid_file)
                if _alive(pid):
                    assert pid is not None
                    self._daemons[settings.uuid] = _Daemon(settings, pid, _process_start(pid),
                                                           state="Running")
                    log.info("adopted MPS daemon %d for %s", pid, settings.uuid)
                else:
                    self._daemons[settings.uuid] = _Daemon(settings, None, None,
                                                           state="Running")
                    log.warning("MPS daemon for %s is gone; the next check restarts it",
                                settings.uuid)
                adopted.append(settings.uuid)
        return adopted

    # -- reporting -------------------------------------------------------------------------------

    def _state(self, daemon: _Daemon) -> DaemonState:
        if _alive(daemon.pid, daemon.started):
            return daemon.state
        return "Failed" if daemon.state == "Failed" else "Starting"

    def status(self) -> dict[str, MpsStatus]:
        """Every managed device's daemon: Running, Starting (died, restart due) or Failed.

        The keys are what the planner treats as "MPS runs here", so a device whose daemon is
        being restarted is not started a second time by a reconcile.
        """
        with self._lock:
            return {uuid: MpsStatus(
                shares=d.settings.shares, thread_percentage=d.settings.thread_percentage,
                memoryMiB=d.settings.memory_mib, daemon=self._state(d),
                pipe_directory=str(self.directories(uuid).pipe), resource=d.settings.resource)
                for uuid, d in sorted(self._daemons.items())}

    def adverts(self) -> dict[str, MpsAdvert]:
        """The shares of every device whose daemon runs, for :meth:`NodeRuntime.refresh`.

        A device whose daemon is down offers nothing: a container given its pipe now would find
        no daemon, and CUDA would silently run it outside MPS, without limits.
        """
        with self._lock:
            adverts = {}
            for uuid, d in sorted(self._daemons.items()):
                if self._state(d) != "Running":
                    continue
                adverts[uuid] = MpsAdvert(d.settings.shares, d.settings.resource, MpsShare(
                    pipe_directory=str(self.directories(uuid).pipe),
                    pinned_memory_mib=d.settings.memory_mib,
                    active_thread_percentage=d.settings.thread_percentage,
                    shm_directory=str(self.shm_directory) if self.shm_directory else None))
            return adverts

    def restarts(self) -> dict[str, int]:
        """Crash restarts per device since this manager started (or adopted it), for metrics."""
        with self._lock:
            return {uuid: d.restarts for uuid, d in sorted(self._daemons.items())}

    def errors(self) -> dict[str, str]:
        """The last restart error of each device whose daemon is Failed."""
        with self._lock:
            return {uuid: d.error for uuid, d in sorted(self._daemons.items())
                    if d.state == "Failed" and d.error}

    def pid(self, uuid: str) -> int | None:
        """The daemon's pid, if it runs."""
        with self._lock:
            daemon = self._daemons.get(uuid)
            return daemon.pid if daemon is not None and _alive(daemon.pid, daemon.started) \
                else None
