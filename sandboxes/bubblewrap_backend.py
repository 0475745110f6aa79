"""bubblewrap backend: namespaces without a Docker engine.

Each execution (or the warm worker) runs under ``bwrap`` in new user, PID, network, IPC, UTS and cgroup namespaces,
with the sandbox rootfs (:func:`sandboxes.image.build_rootfs`, the same Debian tree as the Docker image) mounted
read-only as ``/``, the episode workspace read-write at ``/workspace``, the code cells read-only at
``/mappa/code``, a fresh ``/tmp``, a private ``/proc`` and a minimal ``/dev``. The environment is cleared, all
capabilities are dropped and the process dies with its parent. The network namespace has only a loopback.

Limits are rlimits: address space (``memory_mb``), CPU time (from the timeout), file size, and processes
(``pids``, through ``RLIMIT_NPROC``). ``RLIMIT_NPROC`` counts every process of a user, so when the host runs as
root each session gets its own unprivileged uid (the workspace is handed to it); a non-root host runs every
session as itself, and then ``pids`` is shared with the user's other processes. ``cpus`` is not enforced.

Background processes die with the PID namespace when the block (fresh mode) ends; in warm mode the worker kills
every other process of the sandbox user after each block.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from .base import Limits
from .subprocess_backend import CHILD_ENV, ProcessSandbox, ProcessSession
from .warm import DEFAULT_PRELOAD


class BubblewrapSession(ProcessSession):
    kill_all_after_block = True

    def __init__(self, sandbox: BubblewrapSandbox, workspace=None, keep_workspace=False):
        super().__init__(sandbox, workspace, keep_workspace)
        if os.geteuid() == 0:
            # A uid of its own: RLIMIT_NPROC then limits this session alone.
            self.uid = 200_000 + secrets.randbelow(1_000_000_000)
            for path in (self.workspace, self._ipc_dir):
                os.chown(path, self.uid, self.uid)
        else:
            self.uid = os.geteuid()

    def inside(self, host_path: Path) -> str:
        host_path = Path(host_path)
        for host, mount in ((self._code_dir, "/mappa/code"), (self._ipc_dir, "/mappa/ipc")):
            if host_path.is_relative_to(host):
                return f"{mount}/{host_path.relative_to(host).as_posix()}".rstrip("/")
        raise ValueError(f"{host_path} is not visible inside the sandbox")

    def workspace_inside(self) -> str:
        return "/workspace"

    def python_inside(self) -> str:
        return "/usr/bin/python3"

    def nproc(self) -> int:
        return self.sandbox.limits.pids

    def wrap(self, argv: list[str]) -> list[str]:
        sb: BubblewrapSandbox = self.sandbox  # type: ignore[assignment]
        cmd = [sb.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        cmd += ["--ro-bind", str(sb.rootfs), "/"]
        cmd += ["--bind", str(self.workspace), "/workspace"]
        cmd += ["--ro-bind", str(self._code_dir), "/mappa/code", "--bind", str(self._ipc_dir), "/mappa/ipc"]
        cmd += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--clearenv"]
        env = dict(CHILD_ENV, HOME="/workspace", TMPDIR="/tmp")
        for key, value in env.items():
            cmd += ["--setenv", key, value]
        cmd += ["--chdir", "/workspace", "--", *argv]
        return cmd

    def popen_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"cwd": "/", "env": {"PATH": CHILD_ENV["PATH"]}, "start_new_session": True}
        if os.geteuid() == 0:
            kw.update(user=self.uid, group=self.uid, extra_groups=[])
        return kw


class BubblewrapSandbox(ProcessSandbox):
    """Runs code under ``bwrap`` in the sandbox rootfs. See the module docstring for the isolation."""

    name = "bubblewrap"
    isolated = True
    enforces = frozenset({"timeout_s", "memory_mb", "pids", "output_bytes", "file_size_mb"})
    session_class = BubblewrapSession

    def __init__(
        self,
        limits: Limits | None = None,
        mode: str = "fresh",
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        rootfs: str | Path | None = None,
        build: bool = False,
    ):
        super().__init__(limits, mode=mode, preload=preload, python="/usr/bin/python3")
        from .image import build_rootfs, rootfs_dir

        self.bwrap = shutil.which("bwrap") or ""
        if not self.bwrap:
            raise RuntimeError("the bubblewrap backend needs bwrap: apt-get install -y bubblewrap")
        self.rootfs = Path(rootfs) if rootfs else rootfs_dir()
        if build and rootfs is None:
            build_rootfs()
        if not (self.rootfs / "usr/bin/python3").exists():
            raise RuntimeError(
                f"no sandbox rootfs at {self.rootfs}: build it with `python -m sandboxes build --rootfs-only`"
            )
