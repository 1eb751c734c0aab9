"""Child processes that cannot outlive the test session.

Three independent nets, because each misses a case the others catch:

* every child leads its own process group (``start_new_session``), and :meth:`Process.stop`
  signals the whole group, so helpers a component forks die with it;
* every child is started under ``setpriv --pdeathsig KILL``, so the kernel kills it the moment
  the Python process that started it dies, even by SIGKILL or a pytest-timeout ``os._exit``,
  when no Python code runs at all (the signal follows the *thread* that forked the child, so
  start processes from a long-lived thread such as the main one);
* an ``atexit`` hook stops whatever is still running when the interpreter exits normally.

The fixture's finalizer and :meth:`Cluster.stop` are the normal path; these are for the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_live: set[Process] = set()
_live_lock = threading.Lock()

STOP_TIMEOUT_S = 10.0
"""How long a component gets between SIGTERM and SIGKILL."""


class Process:
    """One started component: its group is signalled, its output goes to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path,
                 cwd: Path | None = None, env: Mapping[str, str] | None = None,
                 pdeathsig: bool = True) -> None:
        self.name = name
        self.argv = tuple(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        prefix: list[str] = []
        setpriv = shutil.which("setpriv")
        if pdeathsig and setpriv:
            prefix = [setpriv, "--pdeathsig", "KILL", "--"]
        elif pdeathsig:
            log.warning("setpriv not found: %s will not die with its parent if it is killed",
                        name)
        with open(log_path, "ab") as out:
            self._popen = subprocess.Popen(
                [*prefix, *self.argv], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, cwd=cwd,
                env=dict(env) if env is not None else None, start_new_session=True)
        self.pid = self._popen.pid
        with _live_lock:
            _live.add(self)

    def __repr__(self) -> str:
        return f"Process({self.name!r}, pid={self.pid})"

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self._popen.poll()

    def alive(self) -> bool:
        return self._popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The end of the component's output, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the whole process group (the leader's pid is its id)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM the group, SIGKILL it after ``timeout``; returns the exit status.

        The group is SIGKILLed once more after the leader is reaped, so a child that ignored
        SIGTERM cannot survive its leader.
        """
        if self._popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self._popen.wait()
        self.signal(signal.SIGKILL)
        with _live_lock:
            _live.discard(self)
        return self._popen.returncode


def stop_all(processes: Sequence[Process], timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop several at once: SIGTERM to all first, so their shutdowns overlap."""
    for process in processes:
        if process.alive():
            process.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        process.stop(max(0.1, deadline - time.monotonic()))


def live() -> tuple[Process, ...]:
    """Every process started here and not yet stopped (for leak checks)."""
    with _live_lock:
        return tuple(_live)


@atexit.register
def _stop_leftovers() -> None:
    stop_all(live(), timeout=5.0)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def rss_mib(pid: int) -> float:
    """Resident memory of one process in MiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def listening_ports() -> set[int]:
    """TCP ports with a socket in LISTEN state on this machine (IPv4 and IPv6)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
