"""Captured output of an execution (the first and last bytes of a stream, what was dropped counted) and the status
of a finished process (:func:`classify`): shared by the backends."""

from __future__ import annotations

import signal

from .base import ExecStatus

TRUNCATION_MARKER = "\n[... output truncated: {dropped} more bytes ...]\n"


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


def classify(
    exit_code: int | None, stderr: str, timed_out: bool, worker_lost: bool = False, oom_killed: bool | None = None
) -> tuple[ExecStatus, str | None]:
    """Map a finished process to a status and a backend message (``worker_lost``: there was no result at all).

    ``oom_killed`` says whether the kernel's OOM killer killed a process of the sandbox during the execution (its
    cgroup's count of OOM kills rose), None where the backend cannot tell. A process that failed while the count rose
    is ``oom``; one killed by SIGKILL while it did not is an ``error``; with no count, a SIGKILL is taken for the
    memory limit, its most likely cause.
    """
    if timed_out and not worker_lost:
        return ExecStatus.TIMEOUT, "execution timed out and was killed"
    if oom_killed and (worker_lost or exit_code != 0):
        # in a warm sandbox the killed process may have been the worker: the block then has no result
        return ExecStatus.OOM, "memory limit of the sandbox reached: the kernel's OOM killer killed a process"
    if worker_lost:
        return ExecStatus.WORKER_LOST, "the warm worker was lost; the block has no result"
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if "MemoryError" in tail or "Unable to allocate" in tail:
        return ExecStatus.OOM, "memory limit reached"
    if exit_code == 0:
        return ExecStatus.OK, None
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
        if sig == signal.SIGKILL:
            if oom_killed is None:
                return ExecStatus.OOM, "killed (SIGKILL), most likely by the memory limit"
            return ExecStatus.ERROR, "killed by SIGKILL (not by the memory limit: the sandbox had no OOM kill)"
        if sig == signal.SIGXCPU:
            return ExecStatus.TIMEOUT, "CPU-time limit reached"
        if sig == signal.SIGXFSZ:
            return ExecStatus.ERROR, "file-size limit reached"
        return ExecStatus.ERROR, f"killed by signal {signal.Signals(sig).name}"
    return ExecStatus.ERROR, None
