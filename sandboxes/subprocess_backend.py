"""Plain subprocess backend: resource limits and a timeout, **no isolation**.

The executed code runs as the current user, with the host's filesystem and network. It gets a clean
environment (no host variables, so API keys are not inherited), its own process group (killed after each
execution, background children included), and rlimits on address space, CPU time and file size. Use it for
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

from .base import ExecResult, Limits, Sandbox, Session, check_env
from .files import snapshot
from .output import OutputCap, classify
from .warm import DEFAULT_PRELOAD, WORKER_SOURCE, WarmWorker, run_block, spawn

MODES = ("fresh", "warm")
GRACE_S = 5.0

# Runs in the child before the agent's code: set rlimits, then exec the real interpreter (limits survive exec).
# Doing this in the child instead of ``preexec_fn`` keeps Popen safe when the host process has threads.
_LAUNCHER = """\
import json, os, resource, sys
mem, cpu, fsize, nproc, nofile = (int(a) for a in sys.argv[1:6])
script, python, env_file = sys.argv[6], sys.argv[7], sys.argv[8]
if env_file:
    with open(env_file, encoding="utf-8") as f: os.environ.update(json.load(f))
if mem: resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if nproc: resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
if nofile: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(python, [python, "-I", "-u", script])
"""

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
        return 0

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
        start = time.monotonic()
        lost = False
        if sb.mode == "warm":
            exit_code, timed_out, out, err, message, lost = self._run_warm(script, timeout, extra)
        else:
            try:
                exit_code, timed_out, out, err = self._run_fresh(script, timeout, extra)
            finally:  # a run's variables are that run's: later blocks must not find them in the code folder
                script.with_suffix(".env.json").unlink(missing_ok=True)
            message = None
        duration = time.monotonic() - start
        status, msg = classify(exit_code, err[0], timed_out, worker_lost=lost)
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
        launcher = [py, "-I", "-S", "-c", _LAUNCHER]
        launcher += [str(lim.memory_mb * 1024 * 1024), str(max(1, int(timeout) + 1))]
        launcher += [str(lim.file_size_mb * 1024 * 1024), str(self.nproc()), str(lim.nofile), self.inside(script), py]
        launcher += [env_file]
        proc = self.launch(launcher, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
        return proc.returncode, timed_out, out_r.text(), err_r.text()

    def _launch_worker(self):
        sb: ProcessSandbox = self.sandbox  # type: ignore[assignment]
        worker = self._code_dir / "_worker.py"
        shutil.copyfile(WORKER_SOURCE, worker)
        os.chmod(worker, 0o644)
        argv = [self.python_inside(), "-I", "-u", self.inside(worker), self.inside(self._ipc_dir / "worker.sock")]
        argv += [self.workspace_inside(), ",".join(sb.preload), "1" if self.kill_all_after_block else "0"]
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
