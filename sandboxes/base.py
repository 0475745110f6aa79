"""The sandbox interface: run agent code in a per-episode workspace, with limits.

A :class:`Sandbox` is a configured backend (limits, interpreter, image). ``sandbox.session()`` opens one
:class:`Session` per episode: it owns a workspace directory that persists across every execution of the
episode (files written by one agent are there for the next) and is removed by ``close()``.

Every execution returns an :class:`ExecResult` whose ``status`` is one of ``ok``, ``error``, ``timeout`` or
``oom``. A backend never raises for a failure of the *executed code*; it raises only when the backend itself
cannot run anything (for example, no Docker engine).
"""

from __future__ import annotations

import abc
import enum
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRUNCATION_MARKER = "\n[... output truncated: {dropped} more bytes ...]\n"


class ExecStatus(enum.StrEnum):
    """Outcome of one execution."""

    OK = "ok"  # exited with code 0
    ERROR = "error"  # non-zero exit (exception, syntax error, killed by a signal other than timeout/oom)
    TIMEOUT = "timeout"  # wall-clock limit reached; the process group was killed
    OOM = "oom"  # memory limit reached (MemoryError, or killed by the kernel's OOM killer)


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to every execution.

    Backends apply what they can; :attr:`Sandbox.enforces` says which of these a backend really enforces.
    """

    timeout_s: float = 10.0
    """Wall-clock seconds per execution; the executed process (and its children) is killed after it."""
    memory_mb: int = 1024
    """Address-space (subprocess) or cgroup (Docker) memory limit."""
    cpus: float = 1.0
    """CPU share (Docker, bubblewrap with cgroups). The subprocess backend limits CPU *time* instead."""
    pids: int = 64
    """Maximum number of processes/threads (Docker, bubblewrap)."""
    output_bytes: int = 16_384
    """Bytes kept from each of stdout and stderr; the rest is counted and dropped with a marker."""
    file_size_mb: int = 256
    """Largest single file the code may write."""
    workspace_mb: int | None = None
    """Quota of the whole workspace (a size-limited tmpfs mounted on it; needs root). None: no quota."""


@dataclass
class FileChange:
    """A workspace file created, modified or deleted by one execution."""

    path: str  # relative to the workspace root, POSIX separators
    change: str  # "created" | "modified" | "deleted"
    size: int  # bytes after the change (0 when deleted)


@dataclass
class ExecResult:
    """Structured result of one execution."""

    status: ExecStatus
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files_changed: list[FileChange] = field(default_factory=list)
    backend: str = ""
    error: str | None = None
    """A message from the backend itself (timeout, oom, signal), separate from the program's stderr."""

    @property
    def ok(self) -> bool:
        return self.status == ExecStatus.OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = str(self.status)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        d = dict(d)
        d["status"] = ExecStatus(d["status"])
        d["files_changed"] = [FileChange(**f) for f in d.get("files_changed", [])]
        return cls(**d)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Map every regular file under ``root`` (symlinks are not followed) to ``(size, mtime_ns)``."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, _dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            p = Path(dirpath, name)
            try:
                st = p.lstat()
            except OSError:
                continue
            out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def diff_snapshots(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[FileChange]:
    changes = []
    for path, (size, mtime) in sorted(after.items()):
        if path not in before:
            changes.append(FileChange(path, "created", size))
        elif before[path] != (size, mtime):
            changes.append(FileChange(path, "modified", size))
    changes.extend(FileChange(path, "deleted", 0) for path in sorted(before.keys() - after.keys()))
    return changes


class Session(abc.ABC):
    """One episode's execution context: a persistent workspace plus the backend's process/container."""

    def __init__(self, sandbox: Sandbox, workspace: Path | None = None, keep_workspace: bool = False):
        self.sandbox = sandbox
        self._owns_workspace = workspace is None
        if workspace is None:
            workspace = Path(tempfile.mkdtemp(prefix="mappa-ws-"))
        else:
            workspace = Path(workspace)
            workspace.mkdir(parents=True, exist_ok=True)
        self.workspace = workspace.resolve()
        self.keep_workspace = keep_workspace
        self.closed = False
        self.executions = 0
        self._quota_mounted = False
        if sandbox.limits.workspace_mb:
            self._mount_quota(sandbox.limits.workspace_mb)

    def _mount_quota(self, size_mb: int) -> None:
        """Bound the workspace with a size-limited tmpfs (writes past it fail with ENOSPC)."""
        if os.geteuid() != 0:
            raise PermissionError("Limits.workspace_mb needs root (it mounts a size-limited tmpfs)")
        if any(self.workspace.iterdir()):
            raise ValueError("Limits.workspace_mb needs an empty workspace")
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(self.workspace)],
            check=True,
            capture_output=True,
        )
        self._quota_mounted = True

    @abc.abstractmethod
    def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Execute Python ``code`` with the workspace as the working directory."""

    def result(
        self,
        status: ExecStatus,
        exit_code: int | None,
        out: tuple[str, bool],
        err: tuple[str, bool],
        duration_s: float,
        before: dict[str, tuple[int, int]],
        backend: str,
        error: str | None,
    ) -> ExecResult:
        """An :class:`ExecResult` whose ``files_changed`` compares the workspace now with ``before``.

        ``out`` and ``err`` are ``(text, truncated)`` pairs, as :meth:`OutputCap.text` returns them.
        """
        return ExecResult(
            status=status,
            exit_code=exit_code,
            stdout=out[0],
            stderr=err[0],
            duration_s=duration_s,
            stdout_truncated=out[1],
            stderr_truncated=err[1],
            files_changed=diff_snapshots(before, snapshot(self.workspace)),
            backend=backend,
            error=error,
        )

    def files(self) -> dict[str, int]:
        """Workspace files (relative path -> size in bytes)."""
        return {p: size for p, (size, _) in snapshot(self.workspace).items()}

    def write_file(self, relpath: str, data: bytes | str) -> None:
        """Place a file in the workspace (task inputs). Refuses paths that escape the workspace."""
        target = (self.workspace / relpath).resolve()  # follows symlinks: a planted link cannot redirect us
        if not target.is_relative_to(self.workspace):
            raise ValueError(f"path escapes the workspace: {relpath!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    def read_file(self, relpath: str, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """Read a workspace file on the host, safely: symlinks (anywhere on the path) and paths that leave the
        workspace are refused, so code in the sandbox cannot make the host read a host file."""
        target = self.workspace / relpath
        if not target.resolve().is_relative_to(self.workspace) or any(
            p.is_symlink() for p in [target, *target.parents] if p.is_relative_to(self.workspace)
        ):
            raise ValueError(f"refusing to read {relpath!r}: it leaves the workspace or is a symlink")
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(f"{relpath!r} is larger than {max_bytes} bytes")
        return data

    def close(self) -> None:
        """Release the backend's resources and remove the workspace (unless ``keep_workspace``)."""
        if self.closed:
            return
        self.closed = True
        self._close_backend()
        if self._quota_mounted:
            kept = None
            if self.keep_workspace:  # the files live in the tmpfs: copy them out, then back under the same path
                kept = Path(tempfile.mkdtemp(prefix=self.workspace.name + "-kept-", dir=self.workspace.parent))
                shutil.copytree(self.workspace, kept, dirs_exist_ok=True, symlinks=True)
            subprocess.run(["umount", "-l", str(self.workspace)], check=False, capture_output=True)
            if kept is not None:
                for item in kept.iterdir():
                    shutil.move(item, self.workspace / item.name)
                kept.rmdir()
        if self._owns_workspace and not self.keep_workspace:
            shutil.rmtree(self.workspace, ignore_errors=True)

    def _close_backend(self) -> None:  # noqa: B027 - optional hook
        """Backend-specific clean-up (stop a container, a worker...)."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class Sandbox(abc.ABC):
    """A configured execution backend; opens one :class:`Session` per episode."""

    name: str = "abstract"
    isolated: bool = False
    """True only for backends that isolate the executed code from the host (filesystem, network, env)."""
    enforces: frozenset[str] = frozenset()
    """Names of the :class:`Limits` fields this backend enforces."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()

    @abc.abstractmethod
    def session(self, workspace: str | Path | None = None, keep_workspace: bool = False) -> Session:
        """Open a session with a fresh (or the given) workspace."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend-wide resources."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limits={self.limits})"


class OutputCap:
    """Keeps the first and the last ``limit // 2`` bytes of a stream and counts what is dropped.

    Keeping the tail matters: a traceback's last line says what went wrong.
    """

    def __init__(self, limit: int):
        self.head_limit = limit - limit // 2
        self.tail_limit = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.tail_limit)]

    def text(self) -> tuple[str, bool]:
        return join_head_tail(bytes(self.head), bytes(self.tail), self.total)


def join_head_tail(head: bytes, tail: bytes, total: int) -> tuple[str, bool]:
    """Decode captured output (UTF-8, invalid bytes replaced), with a marker where bytes were dropped.

    ``head`` is the start of the stream, ``tail`` its end, ``total`` the stream's full length in bytes.
    """
    dropped = total - len(head) - len(tail)
    if dropped <= 0:
        return (head + tail).decode("utf-8", errors="replace"), False
    text = head.decode("utf-8", errors="replace")
    text += TRUNCATION_MARKER.format(dropped=dropped)
    text += tail.decode("utf-8", errors="replace")
    return text, True


def classify(exit_code: int | None, stderr: str, timed_out: bool) -> tuple[ExecStatus, str | None]:
    """Map a finished process to a status and a backend message."""
    if timed_out:
        return ExecStatus.TIMEOUT, "execution timed out and was killed"
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if "MemoryError" in tail or "Unable to allocate" in tail:
        return ExecStatus.OOM, "memory limit reached"
    if exit_code == 0:
        return ExecStatus.OK, None
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
        if sig == signal.SIGKILL:
            return ExecStatus.OOM, "killed (SIGKILL), most likely by the memory limit"
        if sig == signal.SIGXCPU:
            return ExecStatus.TIMEOUT, "CPU-time limit reached"
        if sig == signal.SIGXFSZ:
            return ExecStatus.ERROR, "file-size limit reached"
        return ExecStatus.ERROR, f"killed by signal {signal.Signals(sig).name}"
    return ExecStatus.ERROR, None
