"""Host side of warm execution: start the in-sandbox worker (``_worker.py``), send blocks, read results.

Every backend launches the same worker inside its own isolation; only the launch differs (a host process, a
``bwrap`` command, a ``docker exec``). The worker listens on a Unix socket in a folder shared with the host.

Workers outlive the thread that asked for them: a process with a parent-death signal (``bwrap --die-with-parent``,
the worker's own ``PR_SET_PDEATHSIG``) is killed when the *thread* that forked it exits, so a session driven from
a thread pool would lose its worker after every block. :func:`spawn` therefore starts worker processes from one
long-lived thread of this module, which lives exactly as long as the host process: workers survive the callers'
threads, and the kernel still kills them when the host process ends, however it ends (SIGKILL included).

A block's request is acknowledged by the worker before it forks the block. A worker that is dead before a block,
or dies before acknowledging it, provably did not run it: the block is retried once on a fresh worker. A worker
lost after the acknowledgement gives the status ``worker_lost``, never ``timeout``.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

from .base import Limits

WORKER_SOURCE = Path(__file__).with_name("_worker.py")
DEFAULT_PRELOAD = (
    "numpy",
    "pandas",
    "scipy",
    "sklearn",
    "sklearn.ensemble",
    "sklearn.linear_model",
    "sklearn.metrics",
    "sklearn.model_selection",
    "sklearn.preprocessing",
)
"""Modules the warm worker imports once, before forking: what data-science blocks import most."""


ACK_TIMEOUT_S = 10.0
"""How long a worker may take to acknowledge a block (it does so before forking it)."""


class _Launcher:
    """Runs ``subprocess.Popen`` on one daemon thread that lives as long as the process (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:  # the thread does not exist in a forked child: start another when needed
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._thread = None

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, args=(self._queue,), name="mappa-worker-launcher", daemon=True
                )
                self._thread.start()
            thread, q = self._thread, self._queue
        if threading.current_thread() is thread:
            return subprocess.Popen(*args, **kwargs)
        fut: Future = Future()
        q.put((fut, args, kwargs))
        return fut.result()

    @staticmethod
    def _serve(q: queue.SimpleQueue) -> None:
        while True:
            fut, args, kwargs = q.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as e:
                fut.set_exception(e)


_launcher = _Launcher()


def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(*args, **kwargs)`` from the module's launcher thread: the process's parent-death signal
    follows the host process, not the calling thread."""
    return _launcher.popen(*args, **kwargs)


class WorkerError(RuntimeError):
    pass


class WorkerLost(WorkerError):
    """The worker died (or never started). ``started`` tells whether it had acknowledged the block."""

    def __init__(self, message: str, started: bool):
        super().__init__(message)
        self.started = started


class WorkerTimeout(WorkerError):
    """The worker acknowledged the block but gave no result within the block's timeout plus the grace period."""


class WarmWorker:
    """A connection to one worker.

    ``launch`` starts the worker (inside the sandbox) and returns ``(stop, alive)``: a callable that stops it and
    one that tells whether it still runs (so a worker that dies at start-up is reported at once).
    """

    def __init__(
        self,
        socket_path: Path,
        launch: Callable[[], tuple[Callable[[], None], Callable[[], bool]]],
        start_timeout_s: float = 60.0,
    ):
        self.socket_path = socket_path
        self._launch = launch
        self.start_timeout_s = start_timeout_s
        self._stop: Callable[[], None] | None = None
        self._alive: Callable[[], bool] = lambda: False
        self._sock: socket.socket | None = None
        self._file = None

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self._stop, alive = self._launch()
        self._alive = alive
        deadline = time.monotonic() + self.start_timeout_s
        while not self.socket_path.exists():
            if not self._is_alive():
                self.stop()
                raise WorkerLost("warm worker exited during start-up", started=False)
            if time.monotonic() > deadline:
                self.stop()
                raise WorkerLost(f"warm worker did not start within {self.start_timeout_s:.0f}s", started=False)
            time.sleep(0.01)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(self.socket_path))
        except OSError as e:
            self.stop()
            raise WorkerLost(f"could not connect to the warm worker ({type(e).__name__})", started=False) from None
        self._file = self._sock.makefile("rwb")

    def request(self, payload: dict[str, Any], reply_timeout_s: float) -> dict[str, Any]:
        """Send one block and return the worker's reply.

        A block the worker provably did not start (it was dead, or died before acknowledging the block) is retried
        once on a fresh worker. Raises :class:`WorkerLost` when the worker is lost after all (``started`` says
        whether the block began) and :class:`WorkerTimeout` when no reply comes within ``reply_timeout_s``; the
        worker is stopped in both cases (it restarts on the next block).
        """
        for attempt in (1, 2):
            if self._sock is not None and not self._is_alive():
                self.stop()  # it died since the last block: a fresh worker takes this one
            try:
                if self._sock is None:
                    self.start()
                return self._exchange(payload, reply_timeout_s)
            except WorkerLost as e:
                if e.started or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _is_alive(self) -> bool:
        try:
            return bool(self._alive())
        except Exception:  # e.g. the Docker engine no longer knows the worker's exec
            return False

    def _exchange(self, payload: dict[str, Any], reply_timeout_s: float) -> dict[str, Any]:
        assert self._sock is not None and self._file is not None
        try:
            self._sock.settimeout(min(ACK_TIMEOUT_S, reply_timeout_s))
            self._file.write(json.dumps(payload).encode() + b"\n")
            self._file.flush()
            ack = self._file.readline()
        except (OSError, TimeoutError) as e:
            self.stop()
            raise WorkerLost(f"warm worker did not take the block ({type(e).__name__})", started=False) from None
        if not ack:
            self.stop()
            raise WorkerLost("warm worker exited before taking the block", started=False)
        ack = json.loads(ack)
        if "worker_error" in ack:
            raise WorkerError(ack["worker_error"])
        try:
            self._sock.settimeout(reply_timeout_s)
            line = self._file.readline()
        except TimeoutError:
            self.stop()
            raise WorkerTimeout(f"warm worker gave no result within {reply_timeout_s:g}s") from None
        except OSError as e:
            self.stop()
            raise WorkerLost(f"warm worker died while the block ran ({type(e).__name__})", started=True) from None
        if not line:
            self.stop()
            raise WorkerLost("warm worker died while the block ran", started=True)
        reply = json.loads(line)
        if "worker_error" in reply:
            raise WorkerError(reply["worker_error"])
        return reply

    def stop(self) -> None:
        for closer in (self._file, self._sock):
            try:
                if closer is not None:
                    closer.close()
            except OSError:
                pass
        self._file = self._sock = None
        if self._stop is not None:
            try:
                self._stop()
            finally:
                self._stop = None
        self.socket_path.unlink(missing_ok=True)


class BlockOutcome(NamedTuple):
    exit_code: int | None
    timed_out: bool
    out: tuple[str, bool]
    err: tuple[str, bool]
    message: str | None
    """A message of the host side (the worker was lost or restarted), None otherwise."""
    worker_lost: bool
    """No result: the worker died or could not be started (the status is ``worker_lost``, not ``timeout``)."""
    oom_kills: int | None = None
    """The count of OOM kills in the sandbox's memory group after the block (read by the worker from one of
    ``oom_files``), None when there is none to read or no reply."""
    oom_killed: bool | None = None
    """Whether that count rose while the block ran; None when unknown."""


def run_block(
    worker: WarmWorker,
    path: str,
    limits: Limits,
    timeout: float,
    nproc: int = 0,
    grace_s: float = 5.0,
    env: dict[str, str] | None = None,
    oom_files: tuple[str, ...] = (),
) -> BlockOutcome:
    """Run one block through ``worker``.

    A worker that does not answer within ``timeout + grace_s`` after taking the block is stopped (it restarts on
    the next block) and the block counts as timed out; a worker that dies, or cannot be started, gives
    ``worker_lost`` with a message saying whether the block had started. ``oom_files``: where in the sandbox the
    worker reads the memory group's count of OOM kills, before and after the block (``oom_kill`` lines).
    """
    payload = {
        "path": path,
        "timeout": timeout,
        "output_bytes": limits.output_bytes,
        "memory_bytes": limits.memory_mb * 1024 * 1024,
        "fsize_bytes": limits.file_size_mb * 1024 * 1024,
        "nproc": nproc,
        "nofile": limits.nofile,
        "env": dict(env or {}),  # the session's explicit variables (checked by sandboxes.base.check_env)
        "oom_files": list(oom_files),
    }
    nothing = ("", False)
    try:
        r = worker.request(payload, timeout + grace_s)
    except WorkerTimeout as e:
        return BlockOutcome(None, True, nothing, nothing, f"{e}; the worker was restarted", False)
    except WorkerLost as e:
        when = "the block started but its result was lost" if e.started else "the block never ran (retried once)"
        return BlockOutcome(None, False, nothing, nothing, f"{e}: {when}; a fresh worker takes the next block", True)
    except WorkerError as e:
        return BlockOutcome(None, False, nothing, nothing, f"warm worker error: {e}", True)
    before, after = r.get("oom_kills") or (None, None)
    return BlockOutcome(
        r["exit_code"],
        r["timed_out"],
        (r["stdout"], r["stdout_truncated"]),
        (r["stderr"], r["stderr_truncated"]),
        None,
        False,
        after,
        None if before is None or after is None else after > before,
    )
