"""bubblewrap backend: namespaces without a Docker engine.

Each execution (or the warm worker) runs under ``bwrap`` in new user, PID, network, IPC, UTS and cgroup namespaces,
with the sandbox rootfs (:func:`sandboxes.image.build_rootfs`, the same Debian tree as the Docker image) mounted
read-only as ``/``, the episode workspace read-write at ``/workspace``, the code cells read-only at
``/mappa/code``, a size-limited ``/tmp`` and ``/dev/shm`` (``tmpfs_mb``), a private ``/proc`` and a minimal,
read-only ``/dev``. The environment is cleared, all capabilities are dropped, ``no_new_privs`` is set and the
process dies with its parent. The network namespace has only a loopback.

System calls go through a seccomp filter (:mod:`sandboxes.syscall_filter`: Docker's default profile, stricter on
``ptrace``): ``ptrace``, ``mount``, ``unshare``, ``setns``, ``keyctl``, ``bpf``, ``perf_event_open``,
``userfaultfd`` and the rest of what that profile refuses fail with ``EPERM``, a call the filter does not know with
``ENOSYS`` (the C library falls back to an older one); new user namespaces are refused twice (the filter, and
``--disable-userns`` where this bwrap has it). Without libseccomp's Python bindings the sandbox
still runs, with a warning, and ``"seccomp"`` is missing from :attr:`BubblewrapSandbox.enforces`.

Limits: rlimits per process, as in the subprocess backend (address space ``memory_mb``, CPU time from the
timeout, file size, open files ``nofile``, processes ``pids`` through ``RLIMIT_NPROC``), and, where the host lets
us write the cgroup filesystem (root, :mod:`sandboxes.cgroups`), a cgroup per session that holds for the sandbox
as a whole, as Docker's do: ``memory_mb`` (swap included, ``/tmp`` and the workspace's tmpfs pages counted),
``pids`` and ``cpus``. The process is moved into its group before it runs anything (``bwrap --info-fd`` gives the
sandbox's pid, ``--block-fd`` holds it until the host has moved it). Without cgroups (``enforces`` lacks
``"cgroup"`` and ``"cpus"``), ``memory_mb`` holds per process only and ``cpus`` is not enforced. ``RLIMIT_NPROC``
counts every process of a user, so when the host runs as root each session gets its own unprivileged uid (the
workspace is handed to it); a non-root host runs every session as itself, and then ``pids`` is shared with the
user's other processes unless the cgroup holds it.

PID 1 of the sandbox is our launcher (``bwrap --as-pid-1``: no init of bwrap's, which would be dumpable and of the
code's uid, so that a block could write its memory through ``/proc/1/mem``): it makes itself non-dumpable, sets the
rlimits in the block it forks (or starts the warm worker, itself non-dumpable once it serves), reaps orphans and
reports the block's wait status on a pipe of the host's. Signals from inside the namespace do not reach it.

Background processes die with the PID namespace when the block (fresh mode) ends; in warm mode the worker kills
every other process of the sandbox user after each block.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

from . import cgroups as _cgroups
from .base import Limits
from .subprocess_backend import CHILD_ENV, ProcessSandbox, ProcessSession
from .syscall_filter import program_fd, seccomp_program
from .warm import DEFAULT_PRELOAD

INFO_TIMEOUT_S = 10.0
"""How long bwrap may take to report the sandbox's pid (it does so right after creating it)."""


class BubblewrapSession(ProcessSession):
    kill_all_after_block = True
    sets_nproc = True
    launcher_is_init = True

    def __init__(self, sandbox: BubblewrapSandbox, workspace=None, keep_workspace=False):
        super().__init__(sandbox, workspace, keep_workspace)
        if os.geteuid() == 0:
            # A uid of its own: RLIMIT_NPROC then limits this session alone.
            self.uid = 200_000 + secrets.randbelow(1_000_000_000)
            for path in (self.workspace, self._ipc_dir):
                os.chown(path, self.uid, self.uid)
        else:
            self.uid = os.geteuid()
        self.cgroup: _cgroups.SandboxCgroup | None = None
        if sandbox.cgroups:
            lim = sandbox.limits
            try:
                self.cgroup = _cgroups.SandboxCgroup(lim.memory_mb * 1024 * 1024, lim.pids, lim.cpus)
            except BaseException:
                self.close()
                raise

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

    def wrap(self, argv: list[str]) -> list[str]:
        sb: BubblewrapSandbox = self.sandbox  # type: ignore[assignment]
        cmd = [sb.bwrap, "--unshare-all", *sb.userns_opts, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        # no init of bwrap's (dumpable, of the sandbox's uid: a block could write its memory): our launcher is PID 1
        cmd += ["--as-pid-1"]
        cmd += ["--ro-bind", str(sb.rootfs), "/"]
        cmd += ["--bind", str(self.workspace), "/workspace"]
        cmd += ["--ro-bind", str(self._code_dir), "/mappa/code", "--bind", str(self._ipc_dir), "/mappa/ipc"]
        cmd += [*sb.size_opt, "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        cmd += [*sb.size_opt, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--clearenv"]
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

    def launch(self, argv: list[str], popen: Any = subprocess.Popen, **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` under bwrap with the seccomp filter, and in the session's cgroup before it runs."""
        sb: BubblewrapSandbox = self.sandbox  # type: ignore[assignment]
        cmd = self.wrap(argv)
        opts: list[str] = []
        child_fds: list[int] = []  # the child's ends: closed here once it has them
        info_r = block_w = -1
        try:
            if sb.seccomp_bpf is not None:
                fd = program_fd(sb.seccomp_bpf)  # a file of its own per launch: bwrap reads it from offset 0
                child_fds.append(fd)
                opts += ["--seccomp", str(fd)]
            if self.cgroup is not None:
                info_r, info_w = os.pipe()
                child_fds.append(info_w)
                block_r, block_w = os.pipe()
                child_fds.append(block_r)
                opts += ["--info-fd", str(info_w), "--block-fd", str(block_r)]
            cmd[1:1] = opts
            pass_fds = (*child_fds, *kwargs.pop("pass_fds", ()))
            proc = popen(cmd, pass_fds=pass_fds, **kwargs, **self.popen_kwargs())
        except BaseException:
            for fd in (info_r, block_w):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        if self.cgroup is not None:
            pid = None
            try:
                pid = _child_pid(info_r, INFO_TIMEOUT_S)
                if pid is not None:  # None: bwrap failed before creating the sandbox (its stderr says why)
                    self.cgroup.add(pid)
            except BaseException as e:
                # the sandbox must not run outside its group: kill it while bwrap still holds it back
                for kill, target in ((os.kill, pid), (os.killpg, proc.pid)):
                    try:
                        if target:
                            kill(target, signal.SIGKILL)
                    except OSError:
                        pass
                proc.wait()
                os.close(info_r)
                os.close(block_w)
                raise RuntimeError(f"could not move the sandbox into its cgroup: {e}") from None
            os.close(info_r)
            try:
                os.write(block_w, b"1")  # bwrap goes on: everything it starts from now on is born in the group
            except OSError:
                pass
            os.close(block_w)
        return proc

    def oom_kills(self) -> int | None:
        """The session's cgroup's count, where it has one; else the machine's (per-process limits only)."""
        return self.cgroup.oom_kills() if self.cgroup is not None else super().oom_kills()

    def _close_backend(self) -> None:
        try:
            super()._close_backend()
        finally:
            if self.cgroup is not None:
                self.cgroup.remove()
                self.cgroup = None


def _child_pid(fd: int, timeout_s: float) -> int | None:
    """The sandbox's pid, from bwrap's ``--info-fd`` JSON; None when bwrap ended without writing it."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(json.loads(buf)["child-pid"])
        except (ValueError, KeyError):
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"bwrap did not report the sandbox's pid within {timeout_s:g}s")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            buf += chunk


def _bwrap_help(bwrap: str) -> str:
    try:
        return subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


class BubblewrapSandbox(ProcessSandbox):
    """Runs code under ``bwrap`` in the sandbox rootfs. See the module docstring for the isolation."""

    name = "bubblewrap"
    isolated = True
    enforces = frozenset({"timeout_s", "memory_mb", "pids", "output_bytes", "file_size_mb", "nofile"})
    """What every bubblewrap sandbox enforces; an instance adds ``"seccomp"`` when its filter is loaded, and
    ``"cgroup"`` and ``"cpus"`` when each session gets a cgroup (``memory_mb`` and ``pids`` then hold for the
    sandbox as a whole, not only per process)."""
    session_class = BubblewrapSession

    def __init__(
        self,
        limits: Limits | None = None,
        mode: str = "fresh",
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        rootfs: str | Path | None = None,
        build: bool = False,
        tmpfs_mb: int = 64,
        seccomp: bool = True,
        cgroups: bool | None = None,
    ):
        """``seccomp=False`` runs without the syscall filter. ``cgroups``: None uses a cgroup per session where the
        machine allows it (a warning says why not, elsewhere), True requires one, False never makes one."""
        super().__init__(limits, mode=mode, preload=preload, python="/usr/bin/python3")
        from .image import build_rootfs, rootfs_dir

        self.bwrap = shutil.which("bwrap") or ""
        if not self.bwrap:
            raise RuntimeError("the bubblewrap backend needs bwrap: apt-get install -y bubblewrap")
        help_text = _bwrap_help(self.bwrap)
        self.size_opt = ["--size", str(tmpfs_mb * 1024 * 1024)] if "--size" in help_text else []
        # --disable-userns (bwrap >= 0.8) needs a user namespace of bwrap's own: --unshare-user, not -try
        self.userns_opts = ["--unshare-user", "--disable-userns"] if "--disable-userns" in help_text else []
        enforced = set(type(self).enforces)
        self.seccomp_bpf: bytes | None = None
        if seccomp:
            self.seccomp_bpf, why = seccomp_program()
            if self.seccomp_bpf is None:
                warnings.warn(
                    f"bubblewrap sandbox WITHOUT a seccomp filter: {why}. Code in it can call ptrace, mount, "
                    "keyctl, bpf, perf_event_open... ('seccomp' is not in Sandbox.enforces)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                enforced.add("seccomp")
        self.cgroups = False
        if cgroups is not False:
            where = _cgroups.support()
            if isinstance(where, _cgroups.Support):
                self.cgroups = True
                enforced |= {"cgroup", "cpus"}
                _cgroups.reap()  # the groups of crashed runs (their owner is gone), as Docker's reaper does
            elif cgroups:
                raise RuntimeError(f"no cgroup for the bubblewrap sandbox: {where}")
            else:
                warnings.warn(
                    f"bubblewrap sandbox without a cgroup ({where}): memory_mb holds per process only, pids per uid, "
                    "and cpus is not enforced ('cgroup' is not in Sandbox.enforces)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self.enforces = frozenset(enforced)
        self.rootfs = Path(rootfs) if rootfs else rootfs_dir()
        if build and rootfs is None:
            build_rootfs()
        if not (self.rootfs / "usr/bin/python3").exists():
            raise RuntimeError(
                f"no sandbox rootfs at {self.rootfs}: build it with `python -m sandboxes build --rootfs-only`"
            )
