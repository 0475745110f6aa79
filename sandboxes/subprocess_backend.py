"""Plain subprocess backend: resource limits and a timeout, **no isolation**.

The executed code runs as the current user, with the host's filesystem and network. It gets a clean
environment (no host variables, so API keys are not inherited), its own process group (killed after each
execution, background children included), and rlimits on address space, CPU time and file size. Use it for
development and for trusted code; use the Docker or bubblewrap backends for anything an LLM wrote at scale.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .base import ExecResult, Limits, OutputCap, Sandbox, Session, classify, diff_snapshots, snapshot

# Runs in the child before the agent's code: set rlimits, then exec the real interpreter (limits survive exec).
# Doing this in the child instead of ``preexec_fn`` keeps Popen safe when the host process has threads.
_LAUNCHER = """\
import os, resource, sys
mem, cpu, fsize, script, python = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(python, [python, "-I", "-u", script])
"""

_CHILD_ENV = {
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


class SubprocessSession(Session):
    def __init__(self, sandbox: SubprocessSandbox, workspace=None, keep_workspace=False):
        super().__init__(sandbox, workspace, keep_workspace)
        self._code_dir = Path(tempfile.mkdtemp(prefix="mappa-code-"))

    def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        if self.closed:
            raise RuntimeError("session is closed")
        sb: SubprocessSandbox = self.sandbox  # type: ignore[assignment]
        limits = sb.limits
        timeout = limits.timeout_s if timeout_s is None else timeout_s
        self.executions += 1
        script = self._code_dir / f"cell_{self.executions}.py"
        script.write_text(code, encoding="utf-8", errors="surrogatepass")
        before = snapshot(self.workspace)
        env = dict(_CHILD_ENV, HOME=str(self.workspace), TMPDIR=str(self.workspace))
        cmd = [
            sb.python,
            "-I",
            "-S",
            "-c",
            _LAUNCHER,
            str(limits.memory_mb * 1024 * 1024),
            str(max(1, int(timeout) + 1)),
            str(limits.file_size_mb * 1024 * 1024),
            str(script),
            sb.python,
        ]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=self.workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out_r = _CappedReader(proc.stdout, limits.output_bytes)
        err_r = _CappedReader(proc.stderr, limits.output_bytes)
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
        duration = time.monotonic() - start
        out_r.join(timeout=2.0)
        err_r.join(timeout=2.0)
        proc.stdout.close()
        proc.stderr.close()
        stdout, out_trunc = out_r.text()
        stderr, err_trunc = err_r.text()
        status, message = classify(proc.returncode, stderr, timed_out)
        return ExecResult(
            status=status,
            exit_code=proc.returncode,
            stdout=stdout,
            stderr=stderr,
            duration_s=duration,
            stdout_truncated=out_trunc,
            stderr_truncated=err_trunc,
            files_changed=diff_snapshots(before, snapshot(self.workspace)),
            backend=sb.name,
            error=message,
        )

    def _close_backend(self) -> None:
        shutil.rmtree(self._code_dir, ignore_errors=True)


class SubprocessSandbox(Sandbox):
    """Runs each code block in a fresh ``python -I`` process. Not isolated: see the module docstring."""

    name = "subprocess"
    isolated = False
    enforces = frozenset({"timeout_s", "memory_mb", "output_bytes", "file_size_mb"})

    def __init__(self, limits: Limits | None = None, python: str | None = None):
        super().__init__(limits)
        self.python = python or sys.executable

    def session(self, workspace=None, keep_workspace: bool = False) -> SubprocessSession:
        return SubprocessSession(self, workspace, keep_workspace)
