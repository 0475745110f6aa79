"""The subprocess backend: statuses, limits, workspace persistence, clean environment."""

import time
from pathlib import Path

import pytest

from sandboxes import ExecStatus, Limits, make_sandbox


@pytest.fixture
def session():
    sb = make_sandbox("subprocess", limits=Limits(timeout_s=2.0, memory_mb=512, output_bytes=2000))
    with sb.session() as s:
        yield s


def test_ok_and_files_persist(session):
    r = session.run("open('a.txt', 'w').write('hello')\nprint(6 * 7)")
    assert r.status == ExecStatus.OK and r.exit_code == 0 and r.stdout == "42\n"
    assert [(c.path, c.change) for c in r.files_changed] == [("a.txt", "created")]
    r = session.run("print(open('a.txt').read())")
    assert r.stdout.strip() == "hello"
    assert session.files() == {"a.txt": 5}


def test_error_keeps_traceback(session):
    r = session.run("raise ValueError('boom')")
    assert r.status == ExecStatus.ERROR and r.exit_code == 1
    assert "ValueError: boom" in r.stderr


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Polls until ``pid`` has exited (at most ``within_s``: a bound for a loaded machine, not a timing claim)."""
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_timeout_stops_the_program(session, tmp_path):
    """The limit's program is killed: the result says so, it ran at least the limit, and its process is gone when
    ``run`` returns (the wall-clock speed of the kill is a benchmark's, `mappa bench`, not this test's)."""
    pid_file = tmp_path / "pid"
    r = session.run(f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True: pass")
    assert r.status == ExecStatus.TIMEOUT and r.duration_s >= 2.0, r
    pid = int(pid_file.read_text())
    assert _gone(pid)


def test_memory_bomb_is_oom(session):
    r = session.run("x = bytearray(2 * 1024**3)")
    assert r.status == ExecStatus.OOM


def test_huge_output_truncated_keeping_the_tail(session):
    r = session.run("print('a' * 1_000_000)\nraise SystemExit('the end')")
    assert r.stdout_truncated and len(r.stdout) < 2200
    assert "truncated" in r.stdout
    assert "the end" in r.stderr


def test_host_environment_not_inherited(session, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    r = session.run("import os; print(sorted(os.environ)); print(os.environ.get('OPENAI_API_KEY'))")
    assert "sk-host-secret" not in r.stdout
    assert r.stdout.strip().endswith("None")


def test_background_children_killed(session, tmp_path):
    """A child the program leaves running is killed with it (polled for, no fixed sleep)."""
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid)"
    )
    r = session.run(code)
    assert r.status == ExecStatus.OK, r
    assert _gone(int(r.stdout.strip()))


def test_workspace_removed_on_close():
    sb = make_sandbox("subprocess")
    s = sb.session()
    ws = s.workspace
    s.run("open('f', 'w').write('x')")
    s.close()
    assert not ws.exists()


def test_write_file_refuses_escape(session):
    with pytest.raises(ValueError, match="escapes"):
        session.write_file("../outside.txt", "x")


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        make_sandbox("nope")


def test_not_claimed_isolated():
    assert make_sandbox("subprocess").isolated is False


@pytest.mark.parametrize("mode", ["fresh", "warm"])
def test_open_files_limit(mode):
    sb = make_sandbox("subprocess", limits=Limits(timeout_s=5.0, nofile=64), mode=mode, preload=())
    assert "nofile" in sb.enforces
    code = (
        "import os, socket\nfs = []\ntry:\n    while len(fs) < 10_000:\n"
        "        fs.append(open(os.devnull)); fs.append(socket.socket()); fs += os.pipe()\n"
        "except OSError as e:\n    print(e.errno, len(fs))\n    raise\n"
    )
    with sb.session() as s:
        r = s.run(code)
    assert r.status == ExecStatus.ERROR and "Too many open files" in r.stderr, r
    err, count = (int(x) for x in r.stdout.split())
    assert err == 24 and count < 64
