"""Workspace files as the host sees them: what one execution changed (:func:`snapshot`, :func:`diff_snapshots`), what
a file is (:func:`file_kind`), and the refusal to touch anything but a regular, singly linked file
(:class:`UnsafeFileError`): a named pipe, a socket, a link or a hard link to a host file never blocks or leaks, and
the folders on the way are walked by descriptor (:func:`open_folder`), so code that swaps one for a link meanwhile
leads the host nowhere."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


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


_O_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def workspace_parts(relpath: str) -> tuple[str, ...] | None:
    """The components of a path relative to the workspace (``.`` and empty ones dropped), or None when the path is
    absolute, holds ``..`` or names the workspace itself."""
    parts = PurePosixPath(relpath).parts
    if not parts or parts[0] == "/" or ".." in parts:
        return None
    return parts


def open_folder(root: Path, parts: tuple[str, ...], relpath: str, verb: str, create: bool = False) -> int:
    """A descriptor of the folder ``root/parts...``, reached one component at a time: each is opened relative to the
    descriptor of the one before, with ``O_NOFOLLOW``. No symlink on the way is ever followed, not even one swapped
    in for a folder between two steps (:class:`UnsafeFileError`, its message starting ``refusing to {verb}
    {relpath!r}``). ``create``: missing folders are made. The caller closes the descriptor."""
    fd = os.open(root, _O_FOLDER)
    try:
        for i, part in enumerate(parts):
            try:
                try:
                    step = os.open(part, _O_FOLDER, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, dir_fd=fd)
                    except FileExistsError:  # made meanwhile (maybe as a link): the open below tells
                        pass
                    step = os.open(part, _O_FOLDER, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                try:
                    st = os.lstat(part, dir_fd=fd)
                except OSError:
                    raise e from None
                where = "/".join(parts[: i + 1])
                if stat.S_ISLNK(st.st_mode):
                    why = "is a symbolic link (symlinks are not followed)"
                elif stat.S_ISDIR(st.st_mode):  # a folder again: something else stood there a moment ago
                    why = "was replaced while it was walked"
                else:
                    raise
                raise UnsafeFileError(f"refusing to {verb} {relpath!r}: {where} {why}") from None
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd
