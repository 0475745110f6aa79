"""Workspace files as the host sees them: what one execution changed (:func:`snapshot`, :func:`diff_snapshots`), what
a file is (:func:`file_kind`), and the refusal to touch anything but a regular, singly linked file
(:class:`UnsafeFileError`): a named pipe, a socket, a link or a hard link to a host file never blocks or leaks."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FileChange:
    """A workspace file created, modified or deleted by one execution."""

    path: str  # relative to the workspace root, POSIX separators
    change: str  # "created" | "modified" | "deleted"
    size: int  # bytes after the change (0 when deleted)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Map every file under ``root`` that is not a directory to ``(size, mtime_ns)``, from ``lstat`` only: links are
    not followed and nothing is opened, so a named pipe or a socket is listed without blocking (and is refused by
    :meth:`Session.read_file`)."""
    out: dict[str, tuple[int, int]] = {}
    # an explicit stack, not os.walk's recursion: a tree thousands of folders deep (a few ms of mkdir for the code)
    # must not raise RecursionError here; symlinked folders are listed as entries, never entered
    stack = [(str(root), "")]
    while stack:
        folder, rel = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = f"{rel}{entry.name}"
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, name + "/"))
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out[name] = (st.st_size, st.st_mtime_ns)
    return out


def diff_snapshots(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[FileChange]:
    changes = []
    for path, (size, mtime) in sorted(after.items()):
        if path not in before:
            changes.append(FileChange(path, "created", size))
        elif before[path] != (size, mtime):
            changes.append(FileChange(path, "modified", size))
    changes.extend(FileChange(path, "deleted", 0) for path in sorted(before.keys() - after.keys()))
    return changes


_KINDS = {
    stat.S_IFIFO: "named pipe (FIFO)",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "directory",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFLNK: "symbolic link",
    stat.S_IFREG: "regular file",
}


def file_kind(mode: int) -> str:
    """What a file is, in words (``st_mode`` of an ``lstat``): "named pipe (FIFO)", "socket", "directory"..."""
    return _KINDS.get(stat.S_IFMT(mode), "special file")


class UnsafeFileError(ValueError):
    """A workspace file the host refuses to touch: not a regular file, a hard link, a link, or outside the
    workspace. Its message names what the file is."""


_O_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _refuse_unsafe(relpath: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        extra = " (symlinks are not followed)" if stat.S_ISLNK(st.st_mode) else ""
        raise UnsafeFileError(f"{relpath} is a {file_kind(st.st_mode)}, not a regular file: it is not read{extra}")
    if st.st_nlink > 1:
        raise UnsafeFileError(
            f"{relpath} is a hard link ({st.st_nlink} names for the same file, maybe one outside the workspace): "
            "it is not read"
        )
