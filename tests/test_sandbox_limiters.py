"""What enforces a sandbox's limits is out of the executed code's reach, and the host reports kills for what they are.

- No other process a block can see in its sandbox (an init, a timeout enforcer, the warm worker) is writable through
  ``/proc/<pid>/mem`` or traceable by it, and the block still ends at its timeout.
- A block killed by SIGKILL (by itself, or killing every process it may signal) is not reported as out of memory:
  that takes the kernel's OOM killer.
- A block that stops or kills its parent cannot hang the host program, on any backend (the subprocess backend
  included): ``session.run`` returns within the timeout plus the grace period. These cases run in a child process,
  so that a defect stops that child, not the test session.
- rlimits a host cannot grant (its hard limit is lower) are refused when the sandbox is made, with what to change.
- Whatever the code leaves in the workspace (a private file, a read-only folder holding files), the host can read
  and remove, root or not (scripts/test_unprivileged.sh runs this module as a user who is not root).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandboxes import ExecStatus, Limits, make_sandbox

from .support import BWRAP_SKIP, DOCKER_SKIP

TIMEOUT = 3.0
GRACE_S = 5.0  # the backends' grace period (sandboxes.*_backend.GRACE_S)
LIMITS = Limits(timeout_s=TIMEOUT, memory_mb=256, pids=64, output_bytes=8192)
ROOT = Path(__file__).resolve().parent.parent


def _param(backend: str, mode: str):
    why = {"docker": DOCKER_SKIP, "bubblewrap": BWRAP_SKIP}.get(backend)
    marks = [*([pytest.mark.docker] if backend == "docker" else []), pytest.mark.skipif(bool(why), reason=str(why))]
    return pytest.param(backend, mode, id=f"{backend}-{mode}", marks=marks)


ISOLATED = [_param(b, m) for b in ("docker", "bubblewrap") for m in ("fresh", "warm")]
EVERY = [_param(b, m) for b in ("subprocess", "docker", "bubblewrap") for m in ("fresh", "warm")]

PROBE = """\
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
me = os.getpid()
for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):
    if pid == me:
        continue
    try:
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0].decode() or '?'
    except OSError:
        continue  # gone meanwhile
    try:
        open(f'/proc/{pid}/mem', 'r+b').close()
        mem = 'WRITABLE'
    except OSError as e:
        mem = errno.errorcode[e.errno]
    ctypes.set_errno(0)
    traced = libc.ptrace(ctypes.c_long(16), ctypes.c_long(pid), None, None)  # PTRACE_ATTACH
    if traced == 0:
        libc.ptrace(ctypes.c_long(17), ctypes.c_long(pid), None, None)  # PTRACE_DETACH
    print(pid, cmd, mem, 'TRACED' if traced == 0 else errno.errorcode.get(ctypes.get_errno(), '?'), flush=True)
while True:
    pass
"""


@pytest.mark.parametrize(("backend", "mode"), ISOLATED)
def test_no_process_that_enforces_limits_is_writable_by_the_block(backend, mode):
    """A block sees its sandbox's init, timeout enforcer or warm worker (uid and all): it can neither write their
    memory (a write to /proc/<pid>/mem is no system call a filter sees) nor trace them, and still times out."""
    sb = make_sandbox(backend, limits=LIMITS, mode=mode, preload=())
    try:
        with sb.session() as s:
            assert s.run("print('ready')").ok  # start-up (container, worker) is not part of the timing
            t = time.monotonic()
            r = s.run(PROBE)
            elapsed = time.monotonic() - t
    finally:
        sb.close()
    assert r.status == ExecStatus.TIMEOUT and elapsed <= TIMEOUT + 2.0, (r, elapsed)
    seen = [line.split() for line in r.stdout.strip().splitlines()]
    assert seen, r  # the block sees at least its parent (an init, a worker) or the container's init
    reachable = [s for s in seen if s[2] == "WRITABLE" or s[3] == "TRACED"]
    assert not reachable, f"processes the block could write or trace: {reachable} (all it saw: {seen})"


KILLS = {
    "itself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "everyone": "import os, signal, time\nos.kill(-1, signal.SIGKILL)\ntime.sleep(1)",
}


@pytest.mark.parametrize("whom", sorted(KILLS))
@pytest.mark.parametrize(("backend", "mode"), ISOLATED)
def test_a_sigkill_is_not_reported_as_oom(backend, mode, whom):
    """A block killed by SIGKILL with memory to spare (it killed itself, or every process it may signal: in a warm
    sandbox the worker too) is an error or a lost worker, never ``oom``: the kernel's OOM killer did not act."""
    sb = make_sandbox(backend, limits=LIMITS, mode=mode, preload=())
    try:
        with sb.session() as s:
            r = s.run(KILLS[whom])
            assert r.status != ExecStatus.OOM, r
            if whom == "itself":
                assert r.status == ExecStatus.ERROR and "SIGKILL" in (r.error or ""), r
            assert s.run("print('alive')").stdout == "alive\n"  # the session goes on
    finally:
        sb.close()


def _run_driver(code: str, *args: str, limit_s: float) -> dict:
    """Run ``code`` (a Python script printing one JSON line) in a child process; fail if it is not done in time."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()  # SIGKILL ends it even when stopped
        out, err = proc.communicate()
        pytest.fail(f"the host program did not finish within {limit_s:g}s (stopped or hung); stderr: {err[-2000:]}")
    assert proc.returncode == 0, f"the host program ended with {proc.returncode}; stderr: {err[-2000:]}"
    return json.loads(out.strip().splitlines()[-1])


SIGNAL_PARENT_DRIVER = f"""
import json, sys, time
from sandboxes import Limits, make_sandbox

backend, mode, sig = sys.argv[1:4]
sb = make_sandbox(backend, limits=Limits(timeout_s={TIMEOUT}, memory_mb=256), mode=mode, preload=())
with sb.session() as s:
    assert s.run("print('ready')").ok
    t = time.monotonic()
    r = s.run(f"import os, signal, time\\nos.kill(os.getppid(), signal.{{sig}})\\ntime.sleep(0.5)\\nprint('after')")
    took = time.monotonic() - t
    again = s.run("print('again')")
sb.close()
print(json.dumps({{"status": str(r.status), "error": r.error, "took": took, "again": again.stdout}}))
"""


# a stopped parent holds the block until its time limit (3-8 s on every backend): not for make test-fast
@pytest.mark.parametrize("sig", [pytest.param("SIGSTOP", marks=pytest.mark.slow), "SIGKILL"])
@pytest.mark.parametrize(("backend", "mode"), EVERY)
def test_a_block_that_signals_its_parent_cannot_hang_the_host(backend, mode, sig):
    got = _run_driver(SIGNAL_PARENT_DRIVER, backend, mode, sig, limit_s=120)
    assert got["took"] <= TIMEOUT + GRACE_S + 3.0, got
    assert got["again"] == "again\n", got  # and the session goes on


RLIMIT_DRIVER = """
import json, resource, sys
from sandboxes import Limits, make_sandbox

backend, nofile = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # a host whose hard limit is 64
try:
    sb = make_sandbox(backend, limits=Limits(nofile=nofile), mode="fresh")
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    raise SystemExit(0)
with sb.session() as s:
    r = s.run("import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))")
sb.close()
print(json.dumps({"status": str(r.status), "stdout": r.stdout, "stderr": r.stderr[-500:]}))
"""


@pytest.mark.parametrize(("backend", "mode"), [_param("subprocess", "fresh"), _param("bubblewrap", "fresh")])
def test_an_rlimit_over_the_hosts_hard_limit_is_refused_with_what_to_change(backend, mode):
    got = _run_driver(RLIMIT_DRIVER, backend, "256", limit_s=60)
    error = got.get("error", "")
    assert "RLIMIT_NOFILE" in error and "256" in error and "64" in error and "ulimit" in error, got
    got = _run_driver(RLIMIT_DRIVER, backend, "32", limit_s=60)  # within it: blocks run, with the limit asked for
    assert got.get("status") == "ok" and got["stdout"] == "(32, 32)\n", got


@pytest.mark.parametrize(("backend", "mode"), EVERY)
def test_the_host_reads_and_removes_whatever_the_code_leaves(backend, mode):
    """Files the code makes private and folders it makes read-only (a non-root host once could neither read nor
    remove those of a Docker sandbox: they were another uid's, and the workspace leaked)."""
    sb = make_sandbox(backend, limits=LIMITS, mode=mode, preload=())
    try:
        s = sb.session()
        r = s.run(
            "import os\n"
            "open('private.txt', 'w').write('mine')\n"
            "os.chmod('private.txt', 0o600)\n"
            "os.makedirs('ro/inner')\n"
            "open('ro/inner/f.txt', 'w').write('deep')\n"
            "os.chmod('ro/inner', 0o500)\n"
            "os.chmod('ro', 0o500)\n"
            "print('made')"
        )
        assert r.ok and r.stdout == "made\n", r
        assert s.read_file("private.txt") == b"mine"
        assert s.read_file("ro/inner/f.txt") == b"deep"
        root = s.root
        s.close()
        assert not root.exists(), sorted(str(p) for p in root.rglob("*"))
    finally:
        sb.close()
