"""The sandbox interface: run agent code in a per-episode workspace, with limits.

A :class:`Sandbox` is a configured backend (limits, interpreter, image). ``sandbox.session()`` opens one
:class:`Session` per episode: it owns a workspace directory that persists across every execution of the
episode (files written by one agent are there for the next) and is removed by ``close()``.

Every execution returns an :class:`ExecResult` whose ``status`` is one of ``ok``, ``error``, ``timeout`` or
``oom``, or ``worker_lost`` when a warm worker died and the block has no result. A backend never raises for a
failure of the *executed code*; it raises only when the backend itself cannot run anything (for example, no
Docker engine).
"""

from __future__ import annotations

import abc
import atexit
import enum
import json
import os
import re
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .files import FileChange, diff_snapshots, read_file, snapshot, write_file
from .workspaces import OWNER_FILE, SESSION_PREFIX, owner_record, reap_once, remove_tree


class ExecStatus(enum.StrEnum):
    """Outcome of one execution."""

    OK = "ok"  # exited with code 0
    ERROR = "error"  # non-zero exit (exception, syntax error, killed by a signal other than timeout/oom)
    TIMEOUT = "timeout"  # wall-clock limit reached; the process group was killed
    OOM = "oom"  # memory limit reached (MemoryError, or killed by the kernel's OOM killer)
    WORKER_LOST = "worker_lost"
    """The warm worker died or could not be started: the block's result is unknown (``error`` says whether it
    started at all). Not the executed code's outcome: a block that provably never started is retried once on a
    fresh worker first, and only a second failure is reported."""


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
    nofile: int = 256
    """Open file descriptors per process (``RLIMIT_NOFILE``: files, sockets, pipes); past it, ``EMFILE``."""
    workspace_mb: int | None = None
    """Quota of the whole workspace (a size-limited tmpfs mounted on it; needs root). None: no quota."""


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


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
RESERVED_ENV = ("PATH", "HOME", "TMPDIR", "LD_", "PYTHON", "DYLD_")
"""Names (or prefixes, ending in ``_`` or ``PYTHON``) ``env=`` refuses: they would change how the sandbox's own
interpreter and launcher run, not just what the code reads."""


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The variables of an explicit ``env=`` (a session's or a run's), checked: names of letters, digits and ``_``,
    none of :data:`RESERVED_ENV`, string values without NUL of at most 32 KiB. Only these reach the code: the host's
    own variables never do, whatever is given here."""
    out: dict[str, str] = {}
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ValueError(f"env: {name!r} is not a variable name (letters, digits and _, not starting with a digit)")
        if name in ("PATH", "HOME", "TMPDIR") or name.startswith(("LD_", "PYTHON", "DYLD_")):
            raise ValueError(f"env: {name} is reserved (it changes how the sandbox runs, not what the code reads)")
        if not isinstance(value, str) or "\0" in value or len(value) > 32 * 1024:
            raise ValueError(f"env: the value of {name} must be a string without NUL, at most 32 KiB")
        out[name] = value
    return out


_live_sessions: weakref.WeakSet[Session] = weakref.WeakSet()


@atexit.register
def _close_live_sessions() -> None:
    """Sessions never closed are closed at interpreter exit: workers stopped, folders removed."""
    for s in list(_live_sessions):
        try:
            s.close()
        except Exception:
            pass


class Session(abc.ABC):
    """One episode's execution context: a persistent workspace plus the backend's process/container.

    Each session has a private folder (:data:`SESSION_PREFIX`) that holds the workspace (unless one is given),
    the backend's code and IPC folders, and a marker naming the owning process. The folder is removed by
    ``close()``, at interpreter exit for sessions never closed, and by :func:`reap_workspaces` (``mappa sandbox
    reap``, and the first session of every process) once its owner is dead. ``keep_workspace=True`` sessions
    carry no marker: nothing reaps them.
    """

    def __init__(self, sandbox: Sandbox, workspace: Path | None = None, keep_workspace: bool = False):
        self.sandbox = sandbox
        self.env: dict[str, str] = {}
        """Variables every execution of this session gets (``Sandbox.session(env=...)``); nothing of the host's."""
        self.closed = True  # until the folders exist: close() then has nothing to undo
        self._owns_workspace = workspace is None
        self.keep_workspace = keep_workspace
        self.executions = 0
        self._quota_mounted = False
        reap_once()
        self.root = Path(tempfile.mkdtemp(prefix=SESSION_PREFIX)).resolve()
        try:
            os.chmod(self.root, 0o711)  # a sandbox uid may traverse it (to the bind-mounted folders), not list it
            if not (self._owns_workspace and keep_workspace):
                with open(self.root / OWNER_FILE, "x") as f:
                    json.dump(owner_record(), f)
            if workspace is None:
                workspace = self.root / "workspace"
                workspace.mkdir(mode=0o700)
            else:
                workspace = Path(workspace)
                workspace.mkdir(parents=True, exist_ok=True)
            self.workspace = workspace.resolve()
            if sandbox.limits.workspace_mb:
                self._mount_quota(sandbox.limits.workspace_mb)
        except BaseException:
            remove_tree(self.root)
            raise
        self.closed = False
        _live_sessions.add(self)

    def private_dir(self, name: str, mode: int = 0o700) -> Path:
        """A new folder of this session, outside the workspace (the backend's code or IPC folder)."""
        path = self.root / name
        path.mkdir(mode=mode)
        os.chmod(path, mode)
        return path

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
    def run(self, code: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        """Execute Python ``code`` with the workspace as the working directory; ``env`` adds variables to the
        session's (:func:`check_env`) for this execution only."""

    def env_for(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """The variables an execution gets on top of the backend's fixed ones: the session's, then ``env``."""
        return {**self.env, **check_env(env)}

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

        ``out`` and ``err`` are ``(text, truncated)`` pairs, as :meth:`sandboxes.output.OutputCap.text` returns them.
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
        """Place a file in the workspace (task inputs), making missing folders. Refuses paths that leave the
        workspace (absolute, ``..``) and symlinks anywhere on the path (never followed, even one swapped in
        meanwhile: :func:`~sandboxes.files.open_folder`); never blocks on, or writes through, what the code left
        there (a named pipe, a socket, a hard link to another file: that entry is replaced by a new file)."""
        write_file(self.workspace, relpath, data)

    def read_file(self, relpath: str, max_bytes: int = 64 * 1024 * 1024, timeout_s: float = 30.0) -> bytes:
        """Read a workspace file on the host, safely and without ever blocking.

        Only a regular file with a single link, inside the workspace and reached without symlinks (the folders on
        the way are walked by descriptor: :func:`~sandboxes.files.open_folder`), is read: a symlink, a named pipe
        (which would block the host forever), a socket, a device, a directory or a hard link (on a backend that does
        not isolate, maybe a host file's second name) raises :class:`UnsafeFileError` naming what it is. Files over
        ``max_bytes`` raise :class:`ValueError` before any byte is read, and so does a read that takes longer than
        ``timeout_s``. A missing file raises :class:`FileNotFoundError`.
        """
        return read_file(self.workspace, relpath, max_bytes, timeout_s)

    def close(self) -> None:
        """Release the backend's resources and remove the workspace (unless ``keep_workspace``)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close_backend()
        finally:
            self._remove_folders()

    def _remove_folders(self) -> None:
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
        _live_sessions.discard(self)
        if self._owns_workspace and self.keep_workspace:
            return  # the workspace stays (self.root/workspace); the backend's folders are gone
        remove_tree(self.root)

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
    """Names of the :class:`Limits` fields this backend enforces, plus ``"seccomp"`` (a system-call filter) and
    ``"cgroup"`` (limits held per sandbox, not only per process) where it has them."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()

    @abc.abstractmethod
    def session(
        self, workspace: str | Path | None = None, keep_workspace: bool = False, env: Mapping[str, str] | None = None
    ) -> Session:
        """Open a session with a fresh (or the given) workspace; ``env``: variables every execution gets
        (:func:`check_env`)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend-wide resources."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limits={self.limits})"
