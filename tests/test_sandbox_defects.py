"""Sandbox defects that were found and fixed, each pinned by a test that failed before its fix.

- the host's ``read_file`` / ``write_file`` against code that swaps a parent folder for a symlink meanwhile;
- the Docker reaper and containers of another host (or another user of this host);
- the warm worker's clean-up after a block that keeps forking;
- the bubblewrap system-call filter's answer to calls it does not know (ENOSYS, so that glibc falls back).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest

from sandboxes import Limits, UnsafeFileError, make_sandbox

from .support import BWRAP_SKIP, DOCKER_SKIP, backend_param

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
            swapper.stdout.close()
        assert swapper.returncode == -signal.SIGKILL, "the swapping process stopped early"
        leaked = reads.count(b"OUTSIDE")
        assert (leaked, escaped) == (0, 0), f"{leaked} reads of the host file, {escaped} writes into the host folder"
        assert reads and set(reads) == {b"inside"}


# ------------------------------------------------------------------ the Docker reaper removes only what is ours
def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _owner(host: str, pid: int, uid: int) -> dict[str, str]:
    from sandboxes.docker_backend import LABEL

    labels = {"mappa.owner_host": host, "mappa.owner_pid": str(pid), "mappa.owner_start": "0"}
    return {LABEL: "1", **labels, "mappa.owner_uid": str(uid)}


@pytest.mark.docker
@pytest.mark.skipif(DOCKER_SKIP is not None, reason=DOCKER_SKIP or "")
def test_reaper_leaves_other_hosts_containers():
    """A container of another host (an engine shared by several machines) is never reaped, whatever its owner pid
    says here; one of this host and user whose owner is dead is."""
    import docker.errors

    from sandboxes.docker_backend import docker_client, reap
    from sandboxes.image import DEFAULT_IMAGE

    client = docker_client()
    me, pid = os.geteuid(), _dead_pid()
    made = {}
    try:
        for name, labels in {
            "other host": _owner("some-other-host", pid, me),
            "other user": _owner(socket.gethostname(), pid, me + 1),
            "dead owner": _owner(socket.gethostname(), pid, me),
        }.items():
            made[name] = client.containers.run(
                DEFAULT_IMAGE, ["sleep", "infinity"], detach=True, labels=labels, network_mode="none"
            ).id
        reap(client)
        left = {name for name, cid in made.items() if client.api.containers(all=True, filters={"id": cid})}
        assert left == {"other host", "other user"}
    finally:
        for cid in made.values():
            try:
                client.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass


class _Engine:
    """A Docker client's ``api`` as :func:`reap` uses it: a fixed listing; removals are recorded."""

    def __init__(self, containers: dict[str, dict[str, str]]):
        self.listing = [{"Id": cid, "Labels": labels} for cid, labels in containers.items()]
        self.removed: list[str] = []
        self.api = self

    def containers(self, all: bool, filters: dict) -> list[dict]:
        return self.listing

    def remove_container(self, cid: str, force: bool) -> None:
        self.removed.append(cid)


def test_reaper_all_owners_stays_on_this_host_and_user():
    """``reap(all_owners=True)`` (``mappa sandbox reap --all``) removes this host's and user's containers, live
    owners too, and nobody else's; without it, only those of a dead owner."""
    from sandboxes.docker_backend import reap
    from sandboxes.workspaces import process_start

    host, me, dead = socket.gethostname(), os.geteuid(), _dead_pid()
    live = {**_owner(host, os.getpid(), me), "mappa.owner_start": str(process_start(os.getpid()))}
    engine = _Engine(
        {
            "live": live,
            "dead": _owner(host, dead, me),
            "other host, dead": _owner("some-other-host", dead, me),
            "other host, live": {**live, "mappa.owner_host": "some-other-host"},
            "other user": _owner(host, dead, me + 1),
            "no owner": {"mappa.sandbox": "1"},
        }
    )
    assert reap(engine) == 1 and engine.removed == ["dead"]
    engine.removed.clear()
    assert reap(engine, all_owners=True) == 2 and sorted(engine.removed) == ["dead", "live"]


# ------------------------------------------------------------------ the bubblewrap filter: ENOSYS for unknown calls
SYSCALL_ERRNOS = """
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in (*args, 0, 0, 0, 0, 0)[:5]])
    return "returned" if r != -1 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
print(json.dumps({name: call(*nr_args) for name, nr_args in CALLS.items()}))
"""


@pytest.mark.skipif(BWRAP_SKIP is not None, reason=BWRAP_SKIP or "")
def test_bubblewrap_filter_answers_unknown_calls_with_enosys():
    """A system call the filter does not know fails with ENOSYS, as on a kernel without it (glibc then falls back
    to an older call); the ones it refuses on purpose still fail with EPERM."""
    import json
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the probe uses x86_64 system call numbers")
    calls = {
        "unassigned number": (1000,),
        "fchmodat2 (on no list)": (452, -100, 0, 0, 0),
        "cachestat (on no list)": (451,),
        "clone3": (435,),
        "mount": (165,),
        "ptrace(PTRACE_ATTACH, 1)": (101, 16, 1),
        "unshare(CLONE_NEWUSER)": (272, 0x10000000),
        "clone(CLONE_NEWNS)": (56, 0x20000 | 17),
        "personality(READ_IMPLIES_EXEC)": (135, 0x0400000),
        "socket(AF_VSOCK)": (41, 40, 1, 0),
    }
    sandbox = make_sandbox("bubblewrap")
    assert "seccomp" in sandbox.enforces
    with sandbox.session() as s:
        r = s.run(f"CALLS = {calls!r}\n{SYSCALL_ERRNOS}")
    assert r.ok, r
    got = json.loads(r.stdout)
    unknown = ("unassigned number", "fchmodat2 (on no list)", "cachestat (on no list)", "clone3")
    assert got == {name: "ENOSYS" if name in unknown else "EPERM" for name in calls}, got


# ------------------------------------------------------------------ warm workers: nothing of a block runs on after it
FORKING_BLOCK = """
import subprocess
subprocess.Popen(['sh', '-c', 'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep {tag} & done; sleep {tag}'])
print('started')
"""


def _running(tag: str) -> list[int]:
    """Pids (as the host sees them) of the processes running ``sleep <tag>`` that have not exited: zombies are
    dead, whoever has yet to reap them."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] != [b"sleep", tag.encode()]:
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


@pytest.mark.slow  # 100-200 rounds under load: ~8 s even on the subprocess backend
@pytest.mark.parametrize(
    ("backend", "rounds"),
    [
        backend_param("subprocess", "subprocess", 200),
        backend_param("bubblewrap", "bubblewrap", 200),
        backend_param("docker", "docker", 100),
    ],
)
def test_warm_block_leaves_nothing_running_under_load(backend, rounds):
    """A warm block whose shell is still forking background processes when the block ends, on a machine kept busy:
    once ``run`` returns, none of them still runs. (A SIGKILL only marks a process for death; the worker used to
    answer at once, and on a busy machine a killed process had often not run since, and still ran, command line
    and all, when the next block started.)"""
    tag = str(10**7 + secrets.randbelow(9 * 10**7))
    sandbox = make_sandbox(backend, limits=Limits(timeout_s=5.0, pids=64), mode="warm", preload=())
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    survived, done, start = [], 0, time.monotonic()
    try:
        with sandbox.session() as s:
            while done < rounds and time.monotonic() - start < 25:
                r = s.run(FORKING_BLOCK.format(tag=tag))
                assert r.ok and r.stdout == "started\n", r
                if running := _running(tag):
                    survived.append((done, len(running)))
                done += 1
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        for pid in _running(tag):  # whatever happened, nothing of this test's sleeps outlives it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not survived, f"still running after {len(survived)} of {done} blocks (block, processes): {survived[:10]}"
    assert done >= min(rounds, 20), f"only {done} blocks in 25 s"
