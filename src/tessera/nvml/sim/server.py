"""The far end of ``libnvidia-ml.so.1`` for simulated GPUs: NVML calls over a Unix socket.

The C library (built by ``make nvml-lib`` from :mod:`tessera.nvml.sim.abi`) is what a program
loads where it would load the driver's. It knows nothing of GPUs: it packs each call's arguments
and sends them here, and writes back what comes back. This server unpacks them into the ctypes
objects pynvml would pass and calls :class:`~tessera.nvml.sim.fakelib.FakeNvmlLib`, so the
simulated card behaves the same through either door (``--nvml sim:FILE`` in process, or the
library), over the same state file.

One session per client process (the peer's pid, from ``SO_PEERCRED``): a process's threads each
hold a connection, and share its handles, its ``nvmlInit`` count and its event sets, as they share
one loaded library on a real node. A session ends when its last connection closes.

Wire format, little-endian. A request is ``u32 length`` then the symbol (``u16`` length and
name), ``u8`` argument count, and per argument a tag: ``v`` a ``u64`` value, ``s`` a ``u32``
length and a string, ``n`` a NULL pointer, ``p`` a pointer with ``u32`` length and the bytes the
callee may read. The reply is ``u32 length``, ``i32`` return code, ``u8`` count, then per pointer
argument ``u32`` length and the bytes to write through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.core.errors import StateFileError
from tessera.nvml.sim.abi import SYMBOLS, Arg, Symbol
from tessera.nvml.sim.fakelib import FakeNvmlLib, codes, error_string
from tessera.nvml.sim.store import FileStore

__all__ = ["NvmlServer", "serve"]

log = logging.getLogger(__name__)

_INITS = ("nvmlInit_v2", "nvmlInitWithFlags")
_MAX_FRAME = 1 << 20


class _Int(int):
    """An integer argument passed by value; ``.value`` too, as pynvml sometimes wraps it."""

    @property
    def value(self) -> int:
        return int(self)


@dataclass
class _Session:
    pid: int = 0
    lib: FakeNvmlLib | None = None
    connections: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)


class _Call:
    """One request decoded into the arguments FakeNvmlLib takes, and what to send back."""

    def __init__(self, symbol: Symbol, raw: list[tuple[str, Any]]) -> None:
        self.symbol = symbol
        self.raw = raw
        self.objects: list[Any] = [None] * len(raw)
        self.args: list[Any] = []
        self.refused: int | None = None
        for index, (arg, (tag, data)) in enumerate(zip(symbol.args, raw, strict=True)):
            self.args.append(self._decode(index, arg, tag, data))

    def _decode(self, index: int, arg: Arg, tag: str, data: Any) -> Any:
        if arg.kind == "value":
            return _Int(data)
        if arg.kind == "handle":
            return ctypes.c_void_p(data or None)
        if arg.kind == "cstr":
            return None if tag == "n" else ctypes.c_char_p(data)
        if tag == "n":
            if arg.kind != "array":
                self.refused = codes.INVALID_ARGUMENT  # NVML refuses a NULL out-pointer
            return None
        if arg.kind == "buffer":
            length = int(self.raw[arg.count][1])
            self.objects[index] = ctypes.create_string_buffer(max(length, 1))
            return self.objects[index]
        if arg.kind == "array":
            capacity = arg.capacity
            counter = self.symbol.args[arg.count]
            if counter.kind == "inout":
                tag_count, count_bytes = self.raw[arg.count]
                capacity = (0 if tag_count == "n"
                            else int(ctypes.c_uint.from_buffer_copy(count_bytes).value))
            self.objects[index] = (arg.ctype * capacity)()
            return self.objects[index]
        size = ctypes.sizeof(arg.ctype)
        if arg.kind == "out":
            obj = arg.ctype()
        elif len(data) != size:
            self.refused = codes.INVALID_ARGUMENT
            obj = arg.ctype()
        else:
            obj = arg.ctype.from_buffer_copy(data)
        self.objects[index] = obj
        return ctypes.byref(obj)

    def replies(self) -> list[bytes]:
        """What to write through each pointer argument, in order."""
        out: list[bytes] = []
        for index, arg in enumerate(self.symbol.args):
            if not arg.is_pointer:
                continue
            obj = self.objects[index]
            if obj is None or arg.kind == "in":
                out.append(b"")
            elif arg.kind == "buffer":
                length = int(self.raw[arg.count][1])
                out.append((obj.value + b"\0")[:length])
            elif arg.kind == "array":
                written = self.objects[arg.count]
                count = 0 if written is None else int(written.value)
                count = min(count, len(obj))
                out.append(bytes(obj)[: count * ctypes.sizeof(arg.ctype)])
            else:
                out.append(bytes(obj))
        return out


def _decode_request(payload: bytes) -> tuple[str, list[tuple[str, Any]]]:
    (name_length,) = struct.unpack_from("<H", payload, 0)
    offset = 2
    name = payload[offset:offset + name_length].decode()
    offset += name_length
    count = payload[offset]
    offset += 1
    raw: list[tuple[str, Any]] = []
    for _ in range(count):
        tag = chr(payload[offset])
        offset += 1
        if tag == "v":
            (value,) = struct.unpack_from("<Q", payload, offset)
            offset += 8
            raw.append((tag, value))
        elif tag in ("s", "p"):
            (length,) = struct.unpack_from("<I", payload, offset)
            offset += 4
            raw.append((tag, payload[offset:offset + length]))
            offset += length
        elif tag == "n":
            raw.append((tag, None))
        else:
            raise ValueError(f"unknown argument tag {tag!r}")
    return name, raw


def _reply(code: int, blobs: list[bytes]) -> bytes:
    body = struct.pack("<iB", code, len(blobs)) + b"".join(
        struct.pack("<I", len(blob)) + blob for blob in blobs)
    return struct.pack("<I", len(body)) + body


def _read_exact(connection: socket.socket, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = connection.recv(size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _bind(listener: socket.socket, path: Path) -> None:
    """Bind to ``path`` even past the 107 bytes a socket address holds (a test node's folder
    can be that deep): through the folder's ``/proc/self/fd`` link when the path is long."""
    if len(os.fsencode(path)) < 100:
        listener.bind(str(path))
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        listener.bind(f"/proc/self/fd/{folder}/{path.name}")
    finally:
        os.close(folder)


class NvmlServer:
    """Serves one simulated node's state file on one socket, until :meth:`close`."""

    def __init__(self, state_path: str | os.PathLike[str],
                 socket_path: str | os.PathLike[str]) -> None:
        self.state_path = Path(state_path)
        self.socket_path = Path(socket_path)
        self._sessions: dict[int, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._store: FileStore | None = None
        self._connections: set[socket.socket] = set()
        self.calls_by_client: dict[int, set[str]] = {}
        """The NVML entry points each client process (by pid) has called, known or not: which
        calls a tool such as mig-parted really makes."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve_connection(self.request)

        class Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

            def server_bind(self) -> None:
                _bind(self.socket, Path(str(self.server_address)))

        self._server = Server(str(self.socket_path), Handler)
        os.chmod(self.socket_path, 0o666)  # a container's non-root client reaches it too
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"nvml-sim {self.socket_path}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening and hang up on every client, as a driver unload would."""
        self._server.shutdown()
        self._server.server_close()
        with self._sessions_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> NvmlServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- sessions ---------------------------------------------------------------------------

    def _open_session(self, connection: socket.socket) -> tuple[int, _Session]:
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                            struct.calcsize("3i"))
        pid = struct.unpack("3i", credentials)[0] or -id(connection)
        with self._sessions_lock:
            session = self._sessions.setdefault(pid, _Session(pid))
            session.connections += 1
            self._connections.add(connection)
        return pid, session

    def _close_session(self, pid: int, session: _Session, connection: socket.socket) -> None:
        with self._sessions_lock:
            self._connections.discard(connection)
            session.connections -= 1
            if session.connections <= 0:
                self._sessions.pop(pid, None)

    def _serve_connection(self, connection: socket.socket) -> None:
        pid, session = self._open_session(connection)
        try:
            while True:
                header = _read_exact(connection, 4)
                if header is None:
                    return
                (length,) = struct.unpack("<I", header)
                if length > _MAX_FRAME:
                    log.warning("nvml-sim: dropping a client that sent a %d-byte frame", length)
                    return
                payload = _read_exact(connection, length)
                if payload is None:
                    return
                connection.sendall(self._answer(session, payload))
        except OSError:
            return
        finally:
            self._close_session(pid, session, connection)

    # -- calls ------------------------------------------------------------------------------

    def _library(self, session: _Session, name: str) -> FakeNvmlLib | None:
        if session.lib is None and name in _INITS:
            try:
                if self._store is None:
                    self._store = FileStore(self.state_path)
            except (StateFileError, OSError) as error:
                log.warning("nvml-sim: no driver for this client: %s", error)
                return None
            session.lib = FakeNvmlLib(self._store)
        return session.lib

    def _answer(self, session: _Session, payload: bytes) -> bytes:
        try:
            name, raw = _decode_request(payload)
        except (ValueError, struct.error, UnicodeDecodeError, IndexError):
            return _reply(codes.INVALID_ARGUMENT, [])
        self.calls_by_client.setdefault(session.pid, set()).add(name)
        if name == "nvmlErrorString":
            return _reply(codes.SUCCESS, [error_string(int(raw[0][1]))])
        symbol = SYMBOLS.get(name)
        if symbol is None or len(raw) != len(symbol.args):
            return _reply(codes.INVALID_ARGUMENT if symbol else codes.NOT_SUPPORTED, [])
        lib = self._library(session, name)
        if lib is None:
            return _reply(codes.DRIVER_NOT_LOADED if name in _INITS else codes.UNINITIALIZED, [])
        call = _Call(symbol, raw)
        if call.refused is not None:
            return _reply(call.refused, [b""] * sum(a.is_pointer for a in symbol.args))
        function = getattr(lib, name)
        lock = contextlib.nullcontext() if name == "nvmlEventSetWait_v2" else session.lock
        try:
            with lock:
                code = int(function(*call.args))
        except StateFileError as error:
            log.warning("nvml-sim: %s failed: %s", name, error)
            code = codes.UNKNOWN
        return _reply(code, call.replies())


def serve(state_path: str | os.PathLike[str], socket_path: str | os.PathLike[str]) -> NvmlServer:
    """Start serving ``state_path`` on ``socket_path`` in a background thread."""
    return NvmlServer(state_path, socket_path)
