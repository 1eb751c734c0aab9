"""The one way out of a real-runtime node's own network namespace: the API server.

Each node with a real runtime gets a network namespace of its own, so that what runs on its
host network (the chart's agent and controller pods, their metrics ports and probes) is as
alone as on a real node, and two nodes' pods can listen on one port. Its kubelet and those
pods reach the API server at ``127.0.0.1:PORT`` as on the machine: a :class:`Forwarder`
listens there inside the node's namespace and relays each connection to the API server on the
machine's loopback. TLS passes through untouched (the serving certificate names 127.0.0.1).
Nothing else leaves the namespace, and nothing in it reaches any other address.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading

__all__ = ["Forwarder", "listen_in"]

_CLONE_NEWNET = 0x40000000


def listen_in(netns: str, address: tuple[str, int]) -> socket.socket:
    """A TCP socket listening on ``address`` inside the network namespace at ``netns``
    (``/proc/PID/ns/net``). A short-lived thread enters the namespace (setns changes only the
    calling thread's) and makes the socket there; the caller's namespace never changes, and
    the socket stays in the one it was made in."""
    made: dict[str, object] = {}

    def enter() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            with open(netns) as handle:
                if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns {netns}: {os.strerror(errno)}")
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(address)
            server.listen(128)
            made["socket"] = server
        except BaseException as error:  # handed to the caller's thread
            made["error"] = error

    thread = threading.Thread(target=enter, name="netns-listen")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]  # type: ignore[misc]
    server = made["socket"]
    assert isinstance(server, socket.socket)
    return server


class Forwarder:
    """Relays connections accepted inside a namespace to ``target`` on this machine."""

    def __init__(self, netns: str, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self._server = listen_in(netns, ("127.0.0.1", port))
        self._closed = threading.Event()
        self._links: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"forward-{port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                inside, _ = self._server.accept()
            except OSError:
                return
            try:
                outside = socket.create_connection(self.target, timeout=10)
            except OSError:
                inside.close()
                continue
            outside.settimeout(None)
            with self._lock:
                self._links.update((inside, outside))
            for source, sink in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            with self._lock:
                for end in (source, sink):
                    if end in self._links:
                        self._links.discard(end)
                        end.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            links, self._links = list(self._links), set()
        for end in links:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()
