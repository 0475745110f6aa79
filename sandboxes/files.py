"""Workspace files as the host sees them: what one execution changed (:func:`snapshot`, :func:`diff_snapshots`), what
a file is (:func:`file_kind`), and the host's own reads and writes (:func:`read_file`, :func:`write_file`), which
refuse to touch anything but a regular, singly linked file (:class:`UnsafeFileError`): a named pipe, a socket, a
link or a hard link to a host file never blocks or leaks, and the folders on the way are walked by descriptor
(:func:`open_folder`), so code that swaps one for a link meanwhile leads the host nowhere."""

from __future__ import annotations

import errno
import os
import stat
import time
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


def write_file(root: Path, relpath: str, data: bytes | str) -> None:
    """:meth:`sandboxes.base.Session.write_file` in the workspace ``root``."""
    parts = workspace_parts(relpath)
    if parts is None:
        raise UnsafeFileError(f"path escapes the workspace: {relpath!r}")
    payload = data.encode() if isinstance(data, str) else data
    rel, name = "/".join(parts), parts[-1]
    folder = open_folder(root, parts[:-1], relpath, "write", create=True)
    try:
        try:
            st = os.lstat(name, dir_fd=folder)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise UnsafeFileError(f"{rel} is a directory: it is not overwritten")
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise UnsafeFileError(f"{rel} is a symbolic link: it is not written through (symlinks are not followed)")
        if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1):
            os.unlink(name, dir_fd=folder)
        try:  # no O_TRUNC: a hard link swapped in now is refused below, not emptied
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | _O_SAFE, 0o644, dir_fd=folder)
        except OSError as e:  # a link (ELOOP), a pipe without reader (ENXIO) or a folder swapped in
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            raise UnsafeFileError(f"{rel} was replaced while it was opened: it is not written") from None
    finally:
        os.close(folder)
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or fst.st_nlink > 1:
            raise UnsafeFileError(f"{rel} was replaced while it was opened: it is not written")
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_file(root: Path, relpath: str, max_bytes: int, timeout_s: float) -> bytes:
    """:meth:`sandboxes.base.Session.read_file` in the workspace ``root``."""
    parts = workspace_parts(relpath)
    if parts is None:
        raise UnsafeFileError(f"refusing to read {relpath!r}: it leaves the workspace")
    rel, name = "/".join(parts), parts[-1]
    too_big = f"{rel} is {{}} bytes, over the {max_bytes}-byte limit"
    folder = open_folder(root, parts[:-1], relpath, "read")
    try:
        st = os.lstat(name, dir_fd=folder)
        _refuse_unsafe(rel, st)
        if st.st_size > max_bytes:
            raise ValueError(too_big.format(st.st_size))
        try:  # O_NONBLOCK: a pipe swapped in now cannot block us either
            fd = os.open(name, os.O_RDONLY | _O_SAFE, dir_fd=folder)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise UnsafeFileError(f"{rel} was replaced while it was opened: it is not read") from None
    finally:
        os.close(folder)
    try:
        fst = os.fstat(fd)
        _refuse_unsafe(rel, fst)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafeFileError(f"{rel} was replaced while it was opened: it is not read")
        chunks, size, deadline = [], 0, time.monotonic() + timeout_s
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                raise ValueError(f"reading {rel} took more than {timeout_s:g}s")
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ValueError(too_big.format(f"more than {max_bytes}"))
    return b"".join(chunks)
