"""Session folders, the process that owns them, and the reaper of folders whose owner is dead.

Every :class:`~sandboxes.base.Session` has a private folder in the temporary directory (:data:`SESSION_PREFIX`)
with a marker (:data:`OWNER_FILE`) naming its process by pid, start time and host: pids are reused, the pair is
not. :func:`reap_workspaces` (``mappa sandbox reap``, and the first session of every process) removes only folders
it can prove belong to a dead process of this host and this user.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SESSION_PREFIX = "mappa-session-"
"""Every session's private folder in the temporary directory: ``workspace/`` (unless one was given), the code and
IPC folders of the backend, and :data:`OWNER_FILE`."""
OWNER_FILE = "owner.json"


def process_start(pid: int) -> float:
    """The start time of ``pid`` (clock ticks since boot), -1 when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return float(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1.0


def pid_alive(pid: int, start: float) -> bool:
    """Whether ``pid`` is alive and is the same process (start time matches: pids are reused)."""
    if pid <= 0:
        return False
    return process_start(pid) == start


def owner_record() -> dict[str, Any]:
    """What identifies this process across pid reuse: pid, start time, host."""
    return {"pid": os.getpid(), "start": process_start(os.getpid()), "host": socket.gethostname()}


def remove_tree(path: Path) -> None:
    """Remove a folder the host owns, whatever the code inside left in it: read-only sub-folders, symlinks, a tree
    too deep for Python's recursion (``rm -rf --one-file-system`` then: iterative, never follows links)."""
    for attempt in (1, 2):
        try:
            shutil.rmtree(path, ignore_errors=True)
        except RecursionError:
            pass
        if not os.path.lexists(path) or attempt == 2:
            break
        _open_folders(path)  # a non-root host cannot empty a folder the code made read-only: open them all first
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, check=False)


def _open_folders(path: Path) -> None:
    """``chmod 0o700`` every folder under ``path`` (without following links, without recursion: trees can be deep)."""
    stack = [str(path)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        try:
                            os.chmod(entry.path, 0o700)  # not a link (checked); the code no longer runs
                        except OSError:
                            pass
                        stack.append(entry.path)
        except OSError:
            pass


def _orphaned(entry: os.DirEntry) -> bool:
    """Whether ``entry`` is provably a session folder of a dead process of this host, owned by us."""
    try:
        st = entry.stat(follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
        marker = os.path.join(entry.path, OWNER_FILE)
        mst = os.lstat(marker)
        if not stat.S_ISREG(mst.st_mode) or mst.st_uid != os.geteuid() or mst.st_size > 4096:
            return False
        with open(marker, "rb") as f:
            owner = json.loads(f.read())
        pid, start, host = int(owner["pid"]), float(owner["start"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return host == socket.gethostname() and not pid_alive(pid, start)


def reap_workspaces(tmpdir: str | Path | None = None) -> int:
    """Remove the session folders (workspaces included) of crashed runs; returns how many were removed.

    Only folders it can prove are ours: a name starting with :data:`SESSION_PREFIX`, owned by this user, holding
    an :data:`OWNER_FILE` of this host whose process (pid and start time) is gone. Nothing else is touched: not a
    live run's folder, not another host's, not one without the marker. A workspace that is still a quota mount
    (``Limits.workspace_mb``) is unmounted first.
    """
    removed = 0
    try:
        entries = list(os.scandir(tmpdir or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(SESSION_PREFIX) or not _orphaned(entry):
            continue
        ws = os.path.join(entry.path, "workspace")
        if os.path.ismount(ws):
            subprocess.run(["umount", "-l", ws], check=False, capture_output=True)
            if os.path.ismount(ws):
                continue
        remove_tree(Path(entry.path))
        removed += not os.path.lexists(entry.path)
    return removed


_reaped_once = False


def reap_once() -> None:
    """The first session of a process removes what crashed runs left in the temporary directory."""
    global _reaped_once
    if not _reaped_once:
        _reaped_once = True
        try:
            reap_workspaces()
        except Exception:
            pass


__all__ = [
    "OWNER_FILE",
    "SESSION_PREFIX",
    "owner_record",
    "pid_alive",
    "process_start",
    "reap_once",
    "reap_workspaces",
    "remove_tree",
]
