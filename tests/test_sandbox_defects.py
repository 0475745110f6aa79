"""Sandbox defects that were found and fixed, each pinned by a test that failed before its fix.

- the host's ``read_file`` / ``write_file`` against code that swaps a parent folder for a symlink meanwhile;
- the Docker reaper and containers of another host (or another user of this host);
- the warm worker's clean-up after a block that keeps forking;
- the bubblewrap system-call filter's answer to calls it does not know (ENOSYS, so that glibc falls back).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sandboxes import UnsafeFileError, make_sandbox

# ------------------------------------------------------------------ host file access against a parent-swap race
SWAP = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
print("swapping", flush=True)
while True:  # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE): the two names trade places at once
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
"""


def test_host_file_access_never_follows_a_parent_swapped_for_a_symlink(tmp_path):
    """A process swaps a folder of the workspace for a symlink to a host folder, and back, in a tight loop, while
    the host reads and writes a file under it: the host never reads the host folder's file and never writes into
    it (it walks the path by descriptor, never following a link)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("OUTSIDE")
    with make_sandbox("subprocess").session() as s:
        ws = s.workspace
        (ws / "d").mkdir()
        (ws / "d" / "f").write_text("inside")
        os.symlink(outside, ws / "link")
        swapper = subprocess.Popen([sys.executable, "-c", SWAP, ws / "d", ws / "link"], stdout=subprocess.PIPE)
        assert swapper.stdout.readline() == b"swapping\n"
        reads, escaped = [], 0
        try:
            deadline = time.monotonic() + 20
            for _ in range(2000):
                try:
                    reads.append(s.read_file("d/f"))
                except UnsafeFileError:
                    pass  # refused: d was a symlink at that moment
                try:
                    s.write_file("d/w", "host data")
                except UnsafeFileError:
                    pass
                if os.path.lexists(outside / "w"):
                    escaped += 1
                    os.unlink(outside / "w")
                if time.monotonic() > deadline:
                    break
        finally:
            swapper.kill()
            swapper.wait()
        assert swapper.returncode == -signal.SIGKILL, "the swapping process stopped early"
        leaked = reads.count(b"OUTSIDE")
        assert (leaked, escaped) == (0, 0), f"{leaked} reads of the host file, {escaped} writes into the host folder"
        assert reads and set(reads) == {b"inside"}
