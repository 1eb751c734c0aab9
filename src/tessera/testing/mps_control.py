"""A stand-in ``nvidia-cuda-mps-control``: the MPS control daemon and its client, without a GPU.

It behaves the way the agent's :class:`tessera.agent.mps.MpsManager` relies on the real one
behaving, so the manager's lifecycle code (start, settings through the pipe, crash, restart,
adoption after an agent restart, stop) runs unchanged in tests:

- ``nvidia-cuda-mps-control -d`` daemonizes (double fork, new session, stdio on /dev/null), listens
  on the socket ``control`` in ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), writes
  ``nvidia-cuda-mps-control.pid`` there and logs to ``$CUDA_MPS_LOG_DIRECTORY/control.log``
  (default ``/var/log/nvidia-mps``). The ``-d`` process returns only once the daemon is listening.
  A second daemon on the same pipe directory is refused with ``An instance of this daemon is
  already running`` and exit status 1, as the real one does; a directory left behind by a killed
  daemon (stale pid file and socket) is reclaimed. ``-f`` runs the same daemon in the foreground.
- Without options it is the client: it reads commands from stdin, one a line (``echo quit |
  nvidia-cuda-mps-control``), sends them to the daemon and prints the replies. With no daemon it
  prints an error on stderr and exits 1.
- Commands: ``quit``, ``get_server_list``, ``start_server -uid <uid>`` (records a fake server,
  so tests can make a daemon look busy), ``set_default_active_thread_percentage <pct>``,
  ``get_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit <dev> <N>M|G``
  and ``get_default_device_pinned_mem_limit <dev>`` (``dev`` an ordinal or a ``GPU-``/``MIG-``
  UUID, as in the MPS docs). Anything else gets an error reply and changes nothing.
- Every command is recorded in ``control.log`` as ``Cmd:<command>`` inside ``NEW UI`` / ``UI
  closed`` lines, in the real log's ``[date time Control <pid>] ...`` format, so a test reads what
  the manager sent from where an operator would; :func:`recorded_commands` parses it.

Wording the reference material does not pin down (the reply to an unknown command, the client's
message when no daemon runs, the exact reply formats) is this stand-in's own; the manager does not
depend on it beyond reading numbers back.

The file imports only the standard library and runs as a script, so a wrapper can start it in a
few tens of milliseconds (``python -m tessera.testing.mps_control`` works too, but imports the
whole ``tessera.testing`` package first). :func:`install` writes such a wrapper. If
``$TESSERA_MPS_STANDIN_REGISTRY`` names a file, each daemon appends its pid to it, so test
fixtures can kill any daemon a failing test leaves behind (:func:`kill_registered`).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "ALREADY_RUNNING",
    "PID_FILE",
    "REGISTRY_ENV",
    "SOCKET_NAME",
    "install",
    "kill_registered",
    "main",
    "recorded_commands",
]

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_NAME = "control"
LOG_FILE = "control.log"
REGISTRY_ENV = "TESSERA_MPS_STANDIN_REGISTRY"
ALREADY_RUNNING = "An instance of this daemon is already running"
NO_DAEMON = "Cannot find MPS control daemon process"
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
_DEVICE = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z-]+)$")
_MEMORY = re.compile(r"^\d+[MG]$")
_CONNECTION_TIMEOUT_S = 5.0


def _pipe_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY)


def _log_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIRECTORY)


class _Daemon:
    """The control daemon's state: defaults for the next server, and fake servers."""

    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe = pipe
        self.log_path = log / LOG_FILE
        self.pid = os.getpid()
        self.thread_percentage = 100.0
        self.pinned: dict[str, str] = {}
        self.servers: list[int] = []
        self._lock_fd: int | None = None
        self._listener: socket.socket | None = None

    def log(self, message: str) -> None:
        now = datetime.datetime.now()
        stamp = now.strftime("%Y-%m-%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"[{stamp} Control {self.pid:5d}] {message}\n")

    def claim(self) -> bool:
        """Lock the pid file (held for life, so a SIGKILL frees it) and listen; False if taken."""
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.pipe / PID_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        socket_path = self.pipe / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()  # left by a daemon that was killed
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(socket_path))
        listener.listen(8)
        self._listener = listener
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.pid}\n".encode(), 0)
        registry = os.environ.get(REGISTRY_ENV)
        if registry:
            with open(registry, "a", encoding="utf-8") as out:
                out.write(f"{self.pid}\n")
        self.log(f"Starting control daemon using socket {socket_path}")
        self.log("To connect CUDA applications to this daemon, set env "
                 f"CUDA_MPS_PIPE_DIRECTORY={self.pipe}")
        return True

    def serve(self) -> None:
        assert self._listener is not None
        try:
            running = True
            while running:
                connection, _ = self._listener.accept()
                with connection:
                    running = self._session(connection)
        finally:
            self._release()

    def _session(self, connection: socket.socket) -> bool:
        """One client: a command a line in, a JSON reply a line out. False after ``quit``."""
        connection.settimeout(_CONNECTION_TIMEOUT_S)
        self.log("Accepting connection...")
        self.log("NEW UI")
        running = True
        stream = connection.makefile("rwb")
        try:
            for raw in stream:
                command = raw.decode("utf-8", "replace").strip()
                if not command:
                    continue
                self.log(f"Cmd:{command}")
                reply, running = self.handle(command)
                stream.write(json.dumps({"reply": reply}).encode() + b"\n")
                stream.flush()
                if not running:
                    break
        except (OSError, TimeoutError):
            pass
        finally:
            with contextlib.suppress(OSError):
                stream.close()
        self.log("UI closed")
        return running

    def handle(self, command: str) -> tuple[str, bool]:
        """The reply to one command, and whether the daemon keeps running."""
        name, *args = command.split()
        if name == "quit" and (not args or (args[0] == "-t" and len(args) == 2)):
            self.log("Exit")
            return "", False
        if name == "get_server_list" and not args:
            return "\n".join(str(s) for s in self.servers), True
        if name == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
            self.servers.append(self.pid * 100 + len(self.servers) + 1)
            return "", True
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if 0.0 < value <= 100.0:
                self.thread_percentage = value
                return "", True
            return f"Invalid active thread percentage: {args[0]}", True
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage:.1f}", True
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if not _DEVICE.match(args[0]):
                return f"Invalid device: {args[0]}", True
            if not _MEMORY.match(args[1]):
                return f"Invalid memory limit: {args[1]} (use <N>M or <N>G)", True
            self.pinned[args[0]] = args[1]
            return "", True
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            if not _DEVICE.match(args[0]):
                return f"Invalid device: {args[0]}", True
            return self.pinned.get(args[0], "No limit"), True
        return f"Unrecognized command: {command}", True

    def _release(self) -> None:
        for path in (self.pipe / SOCKET_NAME, self.pipe / PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if self._listener is not None:
            self._listener.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _run_daemon(ready: int | None) -> int:
    """Claim the pipe directory and serve; ``ready`` is a pipe told the outcome."""
    daemon = _Daemon(_pipe_directory(), _log_directory())
    try:
        claimed = daemon.claim()
    except OSError as exc:
        if ready is not None:
            os.write(ready, f"error {exc}".encode())
        else:
            print(f"nvidia-cuda-mps-control: {exc}", file=sys.stderr)
        return 1
    if not claimed:
        if ready is not None:
            os.write(ready, b"running")
        else:
            print(ALREADY_RUNNING)
        return 1
    if ready is not None:
        os.write(ready, b"ok")
        os.close(ready)
    signal.signal(signal.SIGTERM, _on_sigterm)
    daemon.serve()
    return 0


def _daemonize() -> int:
    """``-d``: fork off the daemon and return once it listens (or has said why it cannot)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        chunks = []
        while chunk := os.read(read_end, 256):
            chunks.append(chunk)
        os.close(read_end)
        os.waitpid(child, 0)
        outcome = b"".join(chunks).decode()
        if outcome == "ok":
            return 0
        if outcome == "running":
            print(ALREADY_RUNNING)
        else:
            print(f"nvidia-cuda-mps-control: cannot start: {outcome or 'daemon died'}",
                  file=sys.stderr)
        return 1
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.chdir("/")
    code = 1
    try:
        code = _run_daemon(write_end)
    finally:
        os._exit(code)


def _client(stdin: IO[str], stdout: IO[str]) -> int:
    """No options: send each stdin line to the daemon and print the non-empty replies."""
    commands = [line.strip() for line in stdin if line.strip()]
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(_CONNECTION_TIMEOUT_S)
    try:
        connection.connect(str(_pipe_directory() / SOCKET_NAME))
    except OSError:
        connection.close()
        print(NO_DAEMON, file=sys.stderr)
        return 1
    with connection, connection.makefile("rwb") as stream:
        for command in commands:
            stream.write(command.encode() + b"\n")
            stream.flush()
            line = stream.readline()
            if not line:
                print(NO_DAEMON, file=sys.stderr)
                return 1
            reply = str(json.loads(line)["reply"])
            if reply:
                stdout.write(reply + "\n")
            if command.split()[0] == "quit":
                break
    stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["-d"]:
        return _daemonize()
    if args == ["-f"]:
        return _run_daemon(None)
    if not args:
        return _client(sys.stdin, sys.stdout)
    if args in (["-h"], ["--help"]):
        print("usage: nvidia-cuda-mps-control [-d | -f]  (tessera stand-in)")
        return 0
    print(f"nvidia-cuda-mps-control: unknown option {' '.join(args)}", file=sys.stderr)
    return 1


# -- helpers for tests (not used by the executable) -----------------------------------------


def install(directory: Path, name: str = "nvidia-cuda-mps-control") -> Path:
    """Write an executable ``name`` in ``directory`` that runs this stand-in; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / name
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n',
                       encoding="utf-8")
    wrapper.chmod(0o755)
    return wrapper


def recorded_commands(log_directory: Path) -> list[str]:
    """The commands a daemon logging to ``log_directory`` received, oldest first."""
    path = log_directory / LOG_FILE
    if not path.exists():
        return []
    marker = "] Cmd:"
    return [line.split(marker, 1)[1].rstrip("\n")
            for line in path.read_text(encoding="utf-8").splitlines() if marker in line]


def _registered(registry: Path) -> Iterator[int]:
    if registry.exists():
        for line in registry.read_text(encoding="utf-8").split():
            if line.isdigit():
                yield int(line)


def kill_registered(registry: Path) -> list[int]:
    """SIGKILL every stand-in daemon listed in ``registry`` that still runs; returns their pids.

    A pid is only killed if its command line still names this module, so a pid reused by an
    unrelated process after its daemon exited is left alone.
    """
    killed = []
    for pid in _registered(registry):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if Path(__file__).name.encode() not in cmdline and b"mps_control" not in cmdline:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + 2.0
    while killed and time.monotonic() < deadline and any(
            Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in killed):
        time.sleep(0.01)
    return killed


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


if __name__ == "__main__":
    sys.exit(main())
