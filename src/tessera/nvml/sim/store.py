"""Where a simulated node's state lives: in memory (unit tests) or in a file shared by processes.

A real card keeps its MIG layout when the agent restarts, and every process on the node sees
the same card. :class:`FileStore` gives the simulator that property: each mutating NVML call runs
under an exclusive ``flock``, writes a temporary file and renames it over the state file before
the call returns, so a process killed at any instant leaves the card as it was before or after
the call, never in between. Readers take a shared lock and always see a whole file.

A file that cannot be parsed is never rewritten: :class:`~tessera.core.errors.StateFileError`
names the file, the field and the problem, and the bytes on disk stay as they were.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import ValidationError

from tessera.core.errors import InvalidInputError, StateFileError
from tessera.nvml.sim.state import NodeState

__all__ = ["FileStore", "MemoryStore", "StateStore", "load_state_file", "parse_state"]


class StateStore(Protocol):
    """Read a consistent snapshot, or change the state atomically."""

    def read(self) -> NodeState: ...

    def mutate(self) -> contextlib.AbstractContextManager[NodeState]: ...


class MemoryStore:
    """State held by this process only; the lock makes concurrent NVML calls atomic."""

    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._lock = threading.RLock()
        self._snapshot: NodeState | None = None
        """One private copy of the current state that every read shares until the next
        mutation: NVML readers never change what they read (every change goes through
        :meth:`mutate`), and a deep copy per call was most of a simulated node's CPU (an idle
        agent pass over 56 slices made ~8,000 of them: 4 s)."""

    def read(self) -> NodeState:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._state.model_copy(deep=True)
            return self._snapshot

    @contextlib.contextmanager
    def mutate(self) -> Iterator[NodeState]:
        with self._lock:
            working = self._state.model_copy(deep=True)
            yield working
            self._state = working
            self._snapshot = None


def _error_field(error: ValidationError) -> tuple[str, str]:
    first = error.errors()[0]
    location = ""
    for part in first["loc"]:
        location += f"[{part}]" if isinstance(part, int) else (f".{part}" if location else part)
    return location or "(top level)", first["msg"].removeprefix("Value error, ")


def parse_state(text: str, origin: str) -> NodeState:
    """Parse a state document (JSON, or YAML for hand-written files)."""
    try:
        raw = json.loads(text)  # what FileStore writes; YAML only for hand-written files
    except json.JSONDecodeError:
        try:
            raw = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise StateFileError(origin, "(syntax)", f"not valid JSON or YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise StateFileError(origin, "(top level)", "expected a mapping with 'version' and 'gpus'")
    version = raw.get("version")
    if isinstance(version, int) and version > 1:
        raise StateFileError(
            origin, "version",
            f"format version {version} is newer than this tessera reads (1); upgrade tessera",
        )
    try:
        return NodeState.model_validate(raw)
    except ValidationError as exc:
        field, message = _error_field(exc)
        raise StateFileError(origin, field, message) from exc
    except InvalidInputError as exc:
        raise StateFileError(origin, exc.field, str(exc)) from exc


def load_state_file(path: str | os.PathLike[str]) -> NodeState:
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise StateFileError(
            str(target), "(file)", "no such file; create one with `tessera dev sim init`"
        ) from exc
    except OSError as exc:
        raise StateFileError(str(target), "(file)", f"cannot read: {exc.strerror}") from exc
    return parse_state(text, str(target))


class FileStore:
    """State in a file that every process on the node shares (``--nvml sim:FILE``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._thread_lock = threading.RLock()
        self._cached: tuple[tuple[int, int, int], NodeState] | None = None
        load_state_file(self.path)  # refuse a bad file up front, before any NVML call

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        with self._thread_lock:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, mode)
                yield
            finally:
                os.close(fd)

    def read(self) -> NodeState:
        """A snapshot to read, not to change (use :meth:`mutate` for that).

        Every write renames a new file into place, so the inode names the version: a file
        whose inode, size and mtime are unchanged is not parsed again.
        """
        with self._locked(fcntl.LOCK_SH):
            try:
                status = os.stat(self.path)
            except FileNotFoundError:
                return load_state_file(self.path)  # raises the error that names the fix
            version = (status.st_ino, status.st_size, status.st_mtime_ns)
            if self._cached is None or self._cached[0] != version:
                self._cached = (version, load_state_file(self.path))
            return self._cached[1]

    @contextlib.contextmanager
    def mutate(self) -> Iterator[NodeState]:
        with self._locked(fcntl.LOCK_EX):
            working = load_state_file(self.path)
            yield working
            self._write(working)

    def _write(self, state: NodeState) -> None:
        """Write beside the file, then rename over it; run only under the exclusive lock.

        Holding the lock means no other writer is between its write and its rename, so any
        temporary file still here was left by a process killed in that window: remove it.
        """
        prefix = f".{self.path.name}.tmp-"
        for stale in self.path.parent.glob(prefix + "*"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        payload = json.dumps(state.model_dump(mode="json"), indent=1, sort_keys=False)
        fd, temporary = tempfile.mkstemp(prefix=prefix, dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                # No fsync: the rename is atomic against a killed process, which is the failure
                # modelled; a real card's layout does not survive a reboot either.
                handle.write(payload + "\n")
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise


def write_new_state_file(path: str | os.PathLike[str], state: NodeState) -> None:
    """Create (or replace) a state file atomically; used by ``tessera dev sim init``."""
    target = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent or Path("."))
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(state.model_dump(mode="json"), indent=1) + "\n")
    os.replace(temporary, target)
