"""Host side of warm execution: start the in-sandbox worker (``_worker.py``), send blocks, read results.

Every backend launches the same worker inside its own isolation; only the launch differs (a host process, a
``bwrap`` command, a ``docker exec``). The worker listens on a Unix socket in a folder shared with the host.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


class WorkerError(RuntimeError):
    pass


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
        self._sock: socket.socket | None = None
        self._file = None

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self._stop, alive = self._launch()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.socket_path.exists():
            if not alive():
                self.stop()
                raise WorkerError("warm worker exited during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise WorkerError(f"warm worker did not start within {self.start_timeout_s:.0f}s")
            time.sleep(0.01)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(str(self.socket_path))
        self._file = self._sock.makefile("rwb")

    def request(self, payload: dict[str, Any], reply_timeout_s: float) -> dict[str, Any]:
        """Send one block; raises :class:`WorkerError` (after stopping the worker) if no reply comes in time."""
        if self._sock is None:
            self.start()
        assert self._sock is not None and self._file is not None
        try:
            self._sock.settimeout(reply_timeout_s)
            self._file.write(json.dumps(payload).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        except (OSError, TimeoutError) as e:
            self.stop()
            raise WorkerError(f"warm worker did not answer ({type(e).__name__})") from None
        if not line:
            self.stop()
            raise WorkerError("warm worker exited")
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


def run_block(worker: WarmWorker, path: str, limits: Limits, timeout: float, nproc: int = 0, grace_s: float = 5.0):
    """Run one block through ``worker``: ``(exit_code, timed_out, (stdout, truncated), (stderr, truncated), msg)``.

    A worker that does not answer within ``timeout + grace_s`` is stopped (it restarts on the next block) and the
    block counts as timed out.
    """
    payload = {
        "path": path,
        "timeout": timeout,
        "output_bytes": limits.output_bytes,
        "memory_bytes": limits.memory_mb * 1024 * 1024,
        "fsize_bytes": limits.file_size_mb * 1024 * 1024,
        "nproc": nproc,
    }
    try:
        r = worker.request(payload, timeout + grace_s)
    except WorkerError as e:
        return None, True, ("", False), ("", False), f"{e}; the worker was restarted"
    return (
        r["exit_code"],
        r["timed_out"],
        (r["stdout"], r["stdout_truncated"]),
        (r["stderr"], r["stderr_truncated"]),
        None,
    )
