"""Docker backend: one long-lived, locked-down container per episode.

Each session starts a container from the sandbox image (see :mod:`sandboxes.image`) with:

- no network (``network_mode="none"``), a read-only root filesystem and a small ``/tmp`` tmpfs;
- memory (swap included), CPU and pids limits (cgroups: for the container as a whole), a per-file size limit and
  an open-files limit (per process), no core dumps;
- the engine's default seccomp profile (``ptrace``, ``mount``, ``unshare``, ``keyctl``, ``bpf``... fail with EPERM),
  all capabilities dropped and ``no-new-privileges``; the executed code runs as an unprivileged user (uid 65534
  when the host runs as root; a non-root host's own uid and gid, so that it can read and remove whatever the code
  leaves in the workspace) while PID 1 (docker's init) belongs to root, so a clean-up can kill every process of that
  user;
- the episode workspace bind-mounted read-write at ``/workspace`` and the code cells read-only at ``/mappa/code``;
- an environment of a few fixed variables: nothing from the host.

Each execution runs ``python3 -I -u cell.py`` through ``docker exec``; the host keeps the time: at the timeout it kills
every process of the code's user (no process of the code's uid in the container enforces a limit, which the code
could stop or whose memory it could write), and after each execution it kills any process the code left behind. A
SIGKILL is reported as the memory limit only when the container's memory group counted an OOM kill meanwhile. If
the engine (or the kill) does not end the execution within the timeout plus a grace period, the container is
recreated; the workspace (a host folder) survives. Containers carry the label ``mappa.sandbox`` and their owner's
(:func:`owner_labels`: process, host, user) and are removed at session close, at interpreter exit, and by
:func:`reap` (run when a sandbox is created) for leftovers of crashed runs: only this host's and this user's, whose
owning process is gone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import threading
import time
import weakref
from typing import Any

from .base import ExecResult, ExecStatus, Limits, Sandbox, Session, check_env
from .docker_client import docker_client
from .files import snapshot
from .image import DEFAULT_IMAGE
from .output import OutputCap, classify
from .subprocess_backend import CHILD_ENV
from .warm import DEFAULT_PRELOAD, WORKER_SOURCE, WarmWorker, run_block
from .workspaces import pid_alive as _pid_alive
from .workspaces import process_start as _process_start

LABEL = "mappa.sandbox"
SANDBOX_UID = 65534
"""The uid (and gid) the code runs as when the host runs as root; a non-root host's code runs as the host's user."""
GRACE_S = 5.0
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
"""The container's memory group's count of OOM kills (``oom_kill``), as the container sees it (cgroup v2, v1)."""

_CHILD_ENV = dict(CHILD_ENV, HOME="/workspace", TMPDIR="/tmp")

_live_sessions: weakref.WeakSet[DockerSession] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for s in list(_live_sessions):
        try:
            s.close()
        except Exception:
            pass


def engine_available() -> bool:
    try:
        docker_client(timeout=5)
        return True
    except RuntimeError:
        return False


def owner_labels() -> dict[str, str]:
    """The labels that say whose a container is: this process (pid and start time: pids are reused), host and user."""
    return {
        LABEL: "1",
        "mappa.owner_pid": str(os.getpid()),
        "mappa.owner_start": str(_process_start(os.getpid())),
        "mappa.owner_host": socket.gethostname(),
        "mappa.owner_uid": str(os.geteuid()),
    }


def reap(client=None, *, all_owners: bool = False) -> int:
    """Remove leftover sandbox containers that are provably ours and orphaned: labelled by this host and this user
    (``mappa.owner_host``, ``mappa.owner_uid``) for an owning process that is gone. ``all_owners``: every container
    of this host and user, live owners too. A container of another host (an engine shared by several machines: we
    cannot tell whether its owner lives), of another user, or without these labels is never removed. Returns the
    count."""
    client = client or docker_client()
    removed = 0
    host, uid = socket.gethostname(), str(os.geteuid())
    # the low-level listing: one request, no per-container inspect that a container removed meanwhile (by another
    # session's close, in another thread or process) would turn into NotFound and a failed sandbox start
    for c in client.api.containers(all=True, filters={"label": LABEL}):
        labels = c.get("Labels") or {}
        if labels.get("mappa.owner_host") != host or labels.get("mappa.owner_uid") != uid:
            continue
        pid = int(labels.get("mappa.owner_pid", "0") or 0)
        if all_owners or not _pid_alive(pid, float(labels.get("mappa.owner_start", "0") or 0)):
            try:
                client.api.remove_container(c["Id"], force=True)
                removed += 1
            except Exception:  # already gone, or being removed
                pass
    return removed


class DockerSession(Session):
    def __init__(self, sandbox: DockerSandbox, workspace=None, keep_workspace=False):
        super().__init__(sandbox, workspace, keep_workspace)
        self._code_dir = self.private_dir("code", 0o755)
        self._ipc_dir = self.private_dir("ipc")
        self._worker: WarmWorker | None = None
        self._prepare_workspace()
        self.container = None
        self._start_container()
        _live_sessions.add(self)

    @property
    def user(self) -> str:
        """``uid:gid`` of the executed code: :data:`SANDBOX_UID` for a root host, else the host's own user (files the
        code makes are then the host user's to read and remove, whatever their modes)."""
        if os.geteuid() == 0:
            return f"{SANDBOX_UID}:{SANDBOX_UID}"
        return f"{os.geteuid()}:{os.getegid()}"

    def _prepare_workspace(self) -> None:
        # A root host hands the folders the code writes to SANDBOX_UID; a non-root host's code runs as its own user.
        if os.geteuid() == 0:
            for path in (self.workspace, self._ipc_dir):
                os.chown(path, SANDBOX_UID, SANDBOX_UID)

    def _start_container(self) -> None:
        sb: DockerSandbox = self.sandbox  # type: ignore[assignment]
        from docker.types import Ulimit

        lim = sb.limits
        mem = f"{lim.memory_mb}m"
        fsize = lim.file_size_mb * 1024 * 1024
        self._oom_kills: int | None = 0  # a new memory group: no OOM kill yet
        self.container = sb.client.containers.run(
            sb.image,
            command=["sleep", "infinity"],
            detach=True,
            init=True,
            user="0:0",
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"size={sb.tmpfs_mb}m,mode=1777,noexec,nosuid,nodev"},
            mem_limit=mem,
            memswap_limit=mem,
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                Ulimit(name="fsize", soft=fsize, hard=fsize),
                Ulimit(name="core", soft=0, hard=0),
                Ulimit(name="nofile", soft=lim.nofile, hard=lim.nofile),
            ],
            volumes={
                str(self.workspace): {"bind": "/workspace", "mode": "rw"},
                str(self._code_dir): {"bind": "/mappa/code", "mode": "ro"},
                str(self._ipc_dir): {"bind": "/mappa/ipc", "mode": "rw"},
            },
            working_dir="/workspace",
            environment=dict(_CHILD_ENV),
            labels=owner_labels(),
            auto_remove=False,
        )

    def _exec(
        self, cmd: list[str], user: str, limit: int, deadline: float | None, env: dict[str, str] | None = None
    ) -> tuple[int | None, Any, Any]:
        """Run ``cmd`` in the container; returns (exit code, stdout cap, stderr cap). None exit code: no answer."""
        exec_id, out, err, done = self._start_exec(cmd, user, limit, env)
        finished = done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if not finished:
            return None, out, err
        return self.sandbox.client.api.exec_inspect(exec_id).get("ExitCode"), out, err  # type: ignore[attr-defined]

    def _start_exec(
        self, cmd: list[str], user: str, limit: int, env: dict[str, str] | None = None
    ) -> tuple[str, OutputCap, OutputCap, threading.Event]:
        """Start ``cmd`` in the container: (exec id, stdout cap, stderr cap, an event set when the exec's output
        ends)."""
        api = self.sandbox.client.api  # type: ignore[attr-defined]
        environment = {**_CHILD_ENV, **(env or {})}
        exec_id = api.exec_create(self.container.id, cmd, user=user, workdir="/workspace", environment=environment)
        out, err = OutputCap(limit), OutputCap(limit)
        done = threading.Event()

        def pump() -> None:
            try:
                for o, e in api.exec_start(exec_id, stream=True, demux=True):
                    if o:
                        out.feed(o)
                    if e:
                        err.feed(e)
            except Exception:
                pass
            finally:
                done.set()

        threading.Thread(target=pump, daemon=True).start()
        return exec_id, out, err, done

    def _kill_leftovers(self) -> None:
        """Kill every process of the code's user and read the memory group's count of OOM kills (kept in
        ``_oom_kills``; None where it cannot be read)."""
        # `kill -9 -1` as the code's user kills every process of that user except itself; PID 1 is root's.
        read = " ".join(OOM_FILES)
        cmd = ["sh", "-c", f"kill -9 -1 2>/dev/null; cat {read} 2>/dev/null; true"]
        try:
            code, out, _ = self._exec(cmd, self.user, 4096, time.monotonic() + 10)
        except Exception:
            code = None
        self._oom_kills = None
        if code is not None:
            for line in out.text()[0].splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    self._oom_kills = int(value)
                    break

    def _oom_killed(self, before: int | None) -> bool | None:
        """Whether the memory group counted an OOM kill since it counted ``before``; None when unknown."""
        return None if before is None or self._oom_kills is None else self._oom_kills > before

    def run(self, code: str, *, timeout_s: float | None = None, env=None) -> ExecResult:
        if self.closed:
            raise RuntimeError("session is closed")
        sb: DockerSandbox = self.sandbox  # type: ignore[assignment]
        extra = self.env_for(env)
        timeout = sb.limits.timeout_s if timeout_s is None else timeout_s
        self.executions += 1
        name = f"cell_{self.executions}.py"
        (self._code_dir / name).write_text(code, encoding="utf-8", errors="surrogatepass")
        os.chmod(self._code_dir / name, 0o644)
        before = snapshot(self.workspace)
        start = time.monotonic()
        if sb.mode == "warm":
            return self._run_warm(name, timeout, before, start, extra)
        kills = self._oom_kills  # nothing of the code's runs between executions: the count is the one read last
        cmd = ["python3", "-I", "-u", f"/mappa/code/{name}"]
        exec_id, out, err, done = self._start_exec(cmd, self.user, sb.limits.output_bytes, extra)
        # The host keeps the time: at the timeout every process of the code's user is killed, and the execution
        # gets a grace period to end. Without an end by then (an engine that no longer answers), the container is
        # recreated.
        timed_out = killed = False
        if not done.wait(max(0.0, start + timeout - time.monotonic())):
            # the output can outlast the code (a background process holds it; the engine drains it for up to 2 s):
            # a timeout only if the code's process still runs
            try:
                timed_out = sb.client.api.exec_inspect(exec_id).get("ExitCode") is None
            except Exception:
                timed_out = True
            self._kill_leftovers()
            killed = True
        ended = done.wait(GRACE_S)
        duration = time.monotonic() - start
        exit_code = None
        if ended:
            try:
                exit_code = sb.client.api.exec_inspect(exec_id).get("ExitCode")
            except Exception:
                exit_code = None
        engine_lost = exit_code is None
        if not killed and not engine_lost:
            self._kill_leftovers()
        oom = None if engine_lost else self._oom_killed(kills)
        if engine_lost:
            # No end in time: recreate the container; the workspace is a host folder and stays.
            self._restart_container()
        out_text, err_text = out.text(), err.text()
        # docker reports a process killed by a signal as 128 + its number; 137 is SIGKILL (or an exit(137))
        status, message = classify(
            -9 if exit_code == 137 else exit_code, err_text[0], timed_out or engine_lost, oom_killed=oom
        )
        if engine_lost:
            message = "no answer from the container in time; it was recreated (workspace kept)"
        return self.result(status, exit_code, out_text, err_text, duration, before, f"{sb.name}/fresh", message)

    def _launch_worker(self):
        sb: DockerSandbox = self.sandbox  # type: ignore[assignment]
        shutil.copyfile(WORKER_SOURCE, self._code_dir / "_worker.py")
        os.chmod(self._code_dir / "_worker.py", 0o644)
        cmd = ["python3", "-I", "-u", "/mappa/code/_worker.py", "/mappa/ipc/worker.sock", "/workspace"]
        cmd += [",".join(sb.preload), "1"]
        api = sb.client.api
        exec_id = api.exec_create(self.container.id, cmd, user=self.user, workdir="/workspace")
        api.exec_start(exec_id, detach=True)
        # stopping the worker: kill every process of the sandbox user
        return self._kill_leftovers, lambda: bool(api.exec_inspect(exec_id).get("Running"))

    def _run_warm(self, name: str, timeout: float, before, start: float, env=None) -> ExecResult:
        sb: DockerSandbox = self.sandbox  # type: ignore[assignment]
        if self._worker is None:
            self._worker = WarmWorker(self._ipc_dir / "worker.sock", self._launch_worker)
        kills = self._oom_kills
        o = run_block(self._worker, f"/mappa/code/{name}", sb.limits, timeout, 0, GRACE_S, env=env, oom_files=OOM_FILES)
        if o.exit_code is None:
            # no reply: the worker was stopped (which killed every process of the code's user and read the count)
            oom = self._oom_killed(kills)
            self._restart_container()  # start from a fresh container (workspace kept)
        else:
            oom = o.oom_killed
            self._oom_kills = o.oom_kills  # the worker kills what the block left: nothing runs until the next one
        status, msg = classify(o.exit_code, o.err[0], o.timed_out, worker_lost=o.worker_lost, oom_killed=oom)
        message = None if status == ExecStatus.OOM else o.message
        duration = time.monotonic() - start
        return self.result(status, o.exit_code, o.out, o.err, duration, before, f"{sb.name}/warm", message or msg)

    def _restart_container(self) -> None:
        self._remove_container()
        self._start_container()

    def _remove_container(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:
                pass
            self.container = None

    def _close_backend(self) -> None:
        if self._worker is not None:
            self._worker = None  # its processes die with the container
        self._remove_container()
        shutil.rmtree(self._code_dir, ignore_errors=True)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
        _live_sessions.discard(self)


class DockerSandbox(Sandbox):
    """Runs each code block in the episode's container. See the module docstring for the isolation."""

    name = "docker"
    isolated = True
    enforces = frozenset({"timeout_s", "memory_mb", "cpus", "pids", "output_bytes", "file_size_mb", "nofile"})
    """Plus ``"seccomp"`` (per instance) when the engine applies its default seccomp profile."""

    def __init__(
        self,
        limits: Limits | None = None,
        mode: str = "fresh",
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        image: str = DEFAULT_IMAGE,
        tmpfs_mb: int = 64,
        reap_leftovers: bool = True,
        build: bool = False,
    ):
        super().__init__(limits)
        if mode not in ("fresh", "warm"):
            raise ValueError(f"mode must be 'fresh' or 'warm', not {mode!r}")
        self.mode = mode
        self.preload = tuple(preload)
        self.client = docker_client()
        self.image = image
        self.tmpfs_mb = tmpfs_mb
        if build:
            from .image import build_image

            build_image(image, client=self.client)
        try:
            self.client.images.get(image)
        except Exception:
            raise RuntimeError(
                f"sandbox image {image!r} not found: build it with `python -m sandboxes build` (offline)"
            ) from None
        if reap_leftovers:
            reap(self.client)
        try:
            options = list(self.client.info().get("SecurityOptions") or [])
        except Exception:
            options = []
        # the engine's default profile applies to the containers (none is named), unless it runs them unconfined
        seccomp = [dict(kv.split("=", 1) for kv in o.split(",") if "=" in kv) for o in options if "name=seccomp" in o]
        if any(o.get("profile") != "unconfined" for o in seccomp):
            self.enforces = type(self).enforces | {"seccomp"}

    def session(self, workspace=None, keep_workspace: bool = False, env=None) -> DockerSession:
        env = check_env(env)  # before a container is started
        s = DockerSession(self, workspace, keep_workspace)
        s.env = env
        return s
