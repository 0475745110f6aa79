"""Plain subprocess backend: resource limits and a timeout, **no isolation**.

The executed code runs as the current user, with the host's filesystem and network. It gets a clean
environment (no host variables, so API keys are not inherited), its own process group (killed after each
execution, background children included), and rlimits on address space, CPU time and file size. Its parent is a
throwaway launcher, not the host program: a block that stops or kills its parent cannot hang the host (it can
still reach the host by its pid: nothing here isolates). Use it for
development and for trusted code; use the Docker or bubblewrap backends for anything an LLM wrote at scale.

:class:`ProcessSession` holds what every process-launching backend shares (fresh and warm execution, output
capping, classification); the bubblewrap backend only changes how a process is launched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .base import ExecResult, ExecStatus, Limits, Sandbox, Session, check_env
from .files import snapshot
from .output import OutputCap, classify
from .warm import DEFAULT_PRELOAD, WORKER_SOURCE, WarmWorker, run_block, spawn

MODES = ("fresh", "warm")
GRACE_S = 5.0

# Runs first in the child, and stays between the host and the block (or the warm worker), so that the block's parent
# is never the host program: a block that stops or kills its parent stops or kills this throwaway process. It makes
# itself non-dumpable (a block of the same uid can then neither trace it nor write its memory through
# /proc/<pid>/mem, which no system-call filter sees), forks the block, which sets its rlimits and execs the real
# interpreter (limits survive exec; doing this in a child of ours instead of Popen's ``preexec_fn`` keeps Popen safe
# when the host process has threads), reaps every process that becomes its child (it is PID 1 of a bubblewrap
# sandbox), and writes the block's wait status to the host's pipe ``status_fd`` (an exit code cannot tell a signal
# from ``exit(128 + n)``) before it exits. Limits of 0 are not set; none is set above the hard limit it inherits
# (:func:`check_rlimits` refused those the host cannot grant when the sandbox was made; a per-run timeout may still
# ask for more CPU time than a host allows, and gets the host's limit).
_LAUNCHER = """\
import ctypes, json, os, resource, sys
mem, cpu, fsize, nproc, nofile, status_fd = (int(a) for a in sys.argv[1:7])
env_file, argv = sys.argv[7], sys.argv[8:]
try:
    sealed = ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
except (OSError, AttributeError):
    sealed = False
if not sealed and sys.platform.startswith("linux"):
    raise SystemExit("launcher: could not make itself non-dumpable (prctl)")
def limit(res, soft, hard):
    cap = resource.getrlimit(res)[1]
    if cap != resource.RLIM_INFINITY:
        soft, hard = min(soft, cap), min(hard, cap)
    resource.setrlimit(res, (soft, hard))
pid = os.fork()
if pid == 0:
    try:
        if status_fd >= 0:
            os.close(status_fd)
        if env_file:
            with open(env_file, encoding="utf-8") as f: os.environ.update(json.load(f))
        if mem: limit(resource.RLIMIT_AS, mem, mem)
        if cpu: limit(resource.RLIMIT_CPU, cpu, cpu + 1)
        if fsize: limit(resource.RLIMIT_FSIZE, fsize, fsize)
        if nproc: limit(resource.RLIMIT_NPROC, nproc, nproc)
        if nofile: limit(resource.RLIMIT_NOFILE, nofile, nofile)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.execv(argv[0], argv)
    except BaseException as e:
        print(f"launcher: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    os._exit(127)
while True:
    done, status = os.waitpid(-1, 0)
    if done == pid:
        break
if status_fd >= 0:
    os.write(status_fd, str(status).encode())
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)
"""


def check_rlimits(limits: Limits, nproc: bool = False) -> None:
    """Refuse :class:`Limits` whose rlimits this process could not set in a child: each must be within the
    process's hard limit, which an unprivileged process cannot raise. Otherwise every block would fail; this says
    once, on the host, which limit and what to change. ``nproc``: ``pids`` is set as ``RLIMIT_NPROC`` too."""
    import resource

    mb = 1024 * 1024
    rows = [  # field, rlimit, value asked for, rlimit units per field unit, ulimit option, rlimit units per ulimit unit
        ("memory_mb", "RLIMIT_AS", limits.memory_mb * mb, mb, "v", 1024),
        ("timeout_s", "RLIMIT_CPU", max(1, int(limits.timeout_s) + 1), 1, "t", 1),
        ("file_size_mb", "RLIMIT_FSIZE", limits.file_size_mb * mb, mb, "f", 1024),
        ("nofile", "RLIMIT_NOFILE", limits.nofile, 1, "n", 1),
    ]
    if nproc:
        rows.append(("pids", "RLIMIT_NPROC", limits.pids, 1, "u", 1))
    for field, name, value, per_field, option, per_option in rows:
        hard = resource.getrlimit(getattr(resource, name))[1]
        if value and hard != resource.RLIM_INFINITY and value > hard:
            most = hard // per_field - (1 if name == "RLIMIT_CPU" else 0)  # RLIMIT_CPU is the timeout plus 1 s
            raise RuntimeError(
                f"Limits({field}={getattr(limits, field)}) needs {name} {value}, over this host's hard limit {hard}: "
                f"raise the hard limit of the process that makes the sandbox (`ulimit -H{option} "
                f"{-(-value // per_option)}` as root, or limits.conf), or ask for at most Limits({field}={most})"
            )


CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class _CappedReader(threading.Thread):
    """Drains a pipe into an :class:`OutputCap`."""

    def __init__(self, stream, limit: int):
        super().__init__(daemon=True)
        self.stream = stream
        self.cap = OutputCap(limit)

    def run(self) -> None:
        try:
            while chunk := self.stream.read1(65536):
                self.cap.feed(chunk)
        except (OSError, ValueError):
            pass

    def text(self) -> tuple[str, bool]:
        return self.cap.text()


class ProcessSession(Session):
    """A session whose executions are processes it launches (fresh per block, or forked by a warm worker)."""

    kill_all_after_block = False
    """Whether the warm worker may kill every other process of its user (only inside a PID namespace)."""
    sets_nproc = False
    """Whether ``Limits.pids`` is set as ``RLIMIT_NPROC`` (it counts every process of the user: only where the code
    runs as a user of its own, or in a sandbox)."""
    launcher_is_init = False
    """Whether what :meth:`launch` starts is PID 1 of a PID namespace of its own (bubblewrap ``--as-pid-1``): the
    warm worker then runs under the launcher too, which reaps orphans and, unlike the worker at start-up, is never
    dumpable."""

    def __init__(self, sandbox: ProcessSandbox, workspace=None, keep_workspace=False):
        super().__init__(sandbox, workspace, keep_workspace)
        self._code_dir = self.private_dir("code", 0o755)
        self._ipc_dir = self.private_dir("ipc")
        self._worker: WarmWorker | None = None

    # ---------------------------------------------------------------- launch hooks (overridden by bwrap)
    def inside(self, host_path: Path) -> str:
        """The path under which the executed code sees a file of the code/ipc folders."""
        return str(host_path)

    def workspace_inside(self) -> str:
        return str(self.workspace)

    def python_inside(self) -> str:
        return self.sandbox.python  # type: ignore[attr-defined]

    def wrap(self, argv: list[str]) -> list[str]:
        """The command that runs ``argv`` inside the sandbox."""
        return argv

    def popen_kwargs(self) -> dict[str, Any]:
        env = dict(CHILD_ENV, HOME=self.workspace_inside(), TMPDIR=self.workspace_inside())
        return {"cwd": self.workspace, "env": env, "start_new_session": True}

    def nproc(self) -> int:
        """``RLIMIT_NPROC`` of the executed code, 0 for none (see :attr:`sets_nproc`)."""
        return self.sandbox.limits.pids if self.sets_nproc else 0

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer has killed in this session's sandbox, compared before and after
        each block; None: cannot tell. Here, the whole machine's count (``oom_kill`` in ``/proc/vmstat``): the code
        has no memory limit of a kernel group, only an address-space rlimit (a ``MemoryError``, not a kill)."""
        try:
            with open("/proc/vmstat") as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return None

    def launcher(
        self, argv: list[str], limits: tuple[int, ...] = (0,) * 5, status_fd: int = -1, env_file: str = ""
    ) -> list[str]:
        """The command that runs ``argv`` under :data:`_LAUNCHER`: ``limits`` are (address space, CPU seconds, file
        size, processes, open files), 0 for none."""
        return [self.python_inside(), "-I", "-S", "-c", _LAUNCHER, *map(str, limits), str(status_fd), env_file, *argv]

    def launch(self, argv: list[str], popen: Any = subprocess.Popen, **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` in the sandbox: ``popen(self.wrap(argv), **kwargs, **self.popen_kwargs())``. A backend
        that must act between the spawn and the start of the code (bubblewrap: seccomp, its cgroup) overrides it."""
        return popen(self.wrap(argv), **kwargs, **self.popen_kwargs())

    # ---------------------------------------------------------------- execution
    def run(self, code: str, *, timeout_s: float | None = None, env=None) -> ExecResult:
        if self.closed:
            raise RuntimeError("session is closed")
        sb: ProcessSandbox = self.sandbox  # type: ignore[assignment]
        extra = self.env_for(env)
        timeout = sb.limits.timeout_s if timeout_s is None else timeout_s
        self.executions += 1
        script = self._code_dir / f"cell_{self.executions}.py"
        script.write_text(code, encoding="utf-8", errors="surrogatepass")
        os.chmod(script, 0o644)
        before = snapshot(self.workspace)
        kills = self.oom_kills()
        start = time.monotonic()
        lost = False
        if sb.mode == "warm":
            exit_code, timed_out, out, err, message, lost = self._run_warm(script, timeout, extra)[:6]
        else:
            try:
                exit_code, timed_out, out, err = self._run_fresh(script, timeout, extra)
            finally:  # a run's variables are that run's: later blocks must not find them in the code folder
                script.with_suffix(".env.json").unlink(missing_ok=True)
            message = None
        duration = time.monotonic() - start
        now = self.oom_kills()
        oom = None if kills is None or now is None else now > kills
        status, msg = classify(exit_code, err[0], timed_out, worker_lost=lost, oom_killed=oom)
        if status == ExecStatus.OOM:
            message = None  # the memory limit says more than "the worker was lost"
        return self.result(status, exit_code, out, err, duration, before, f"{sb.name}/{sb.mode}", message or msg)

    def _run_fresh(self, script: Path, timeout: float, env: dict[str, str] | None = None):
        lim = self.sandbox.limits
        py = self.python_inside()
        env_file = ""
        if env:  # the session's explicit variables, read by the launcher before it execs the interpreter
            path = script.with_suffix(".env.json")
            path.write_text(json.dumps(env), encoding="utf-8")
            os.chmod(path, 0o644)
            env_file = self.inside(path)
        limits = (lim.memory_mb * 1024 * 1024, max(1, int(timeout) + 1), lim.file_size_mb * 1024 * 1024)
        limits += (self.nproc(), lim.nofile)
        status_r, status_w = os.pipe()  # the launcher writes the block's wait status here
        try:
            argv = self.launcher([py, "-I", "-u", self.inside(script)], limits, status_w, env_file)
            proc = self.launch(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_w,)
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        out_r, err_r = _CappedReader(proc.stdout, lim.output_bytes), _CappedReader(proc.stderr, lim.output_bytes)
        out_r.start()
        err_r.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Kill the whole group: the timed-out program, or children it left in the background.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        out_r.join(timeout=2.0)
        err_r.join(timeout=2.0)
        proc.stdout.close()
        proc.stderr.close()
        return self._block_exit_code(proc.returncode, status_r), timed_out, out_r.text(), err_r.text()

    @staticmethod
    def _block_exit_code(returncode: int, status_r: int) -> int:
        """The block's exit code (negative: killed by that signal) from the launcher's status pipe, which ``status_r``
        reads and is closed here; without a status there (the launcher was killed first), the process's own code."""
        os.set_blocking(status_r, False)
        try:
            status = os.read(status_r, 64)
        except OSError:
            status = b""
        finally:
            os.close(status_r)
        try:
            return os.waitstatus_to_exitcode(int(status))
        except ValueError:
            return returncode

    def _launch_worker(self):
        sb: ProcessSandbox = self.sandbox  # type: ignore[assignment]
        worker = self._code_dir / "_worker.py"
        shutil.copyfile(WORKER_SOURCE, worker)
        os.chmod(worker, 0o644)
        argv = [self.python_inside(), "-I", "-u", self.inside(worker), self.inside(self._ipc_dir / "worker.sock")]
        argv += [self.workspace_inside(), ",".join(sb.preload), "1" if self.kill_all_after_block else "0"]
        if self.launcher_is_init:
            argv = self.launcher(argv)
        # preload failures and the like, in the session's own folder: the ipc folder is the sandbox's to write (a
        # FIFO or a symlink planted there as worker.log would block or redirect the host's open)
        with open(self.root / "worker.log", "ab") as log:
            # from the launcher thread: a parent-death signal must follow the host process, not this thread
            proc = self.launch(argv, spawn, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        def stop() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()

        return stop, lambda: proc.poll() is None

    def _run_warm(self, script: Path, timeout: float, env: dict[str, str] | None = None):
        if self._worker is None:
            self._worker = WarmWorker(self._ipc_dir / "worker.sock", self._launch_worker)
        return run_block(
            self._worker, self.inside(script), self.sandbox.limits, timeout, self.nproc(), GRACE_S, env=env
        )

    def _close_backend(self) -> None:
        if self._worker is not None:
            self._worker.stop()
        shutil.rmtree(self._code_dir, ignore_errors=True)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)


class ProcessSandbox(Sandbox):
    """Common options of the process-launching backends."""

    session_class: type[ProcessSession] = ProcessSession

    def __init__(
        self,
        limits: Limits | None = None,
        mode: str = "fresh",
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        python: str | None = None,
    ):
        super().__init__(limits)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.preload = tuple(preload)
        self.python = python or sys.executable
        check_rlimits(self.limits, nproc=self.session_class.sets_nproc)

    def session(self, workspace=None, keep_workspace: bool = False, env=None) -> ProcessSession:
        env = check_env(env)  # before anything is built
        s = self.session_class(self, workspace, keep_workspace)
        s.env = env
        return s


class SubprocessSession(ProcessSession):
    pass


class SubprocessSandbox(ProcessSandbox):
    """Runs each code block in a fresh ``python -I`` process (or a warm worker's fork). Not isolated."""

    name = "subprocess"
    isolated = False
    enforces = frozenset({"timeout_s", "memory_mb", "output_bytes", "file_size_mb", "nofile"})
    session_class = SubprocessSession
