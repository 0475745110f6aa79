"""The subprocess backend: statuses, limits, workspace persistence, clean environment."""

import time

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


def test_timeout_within_a_second(session):
    t = time.monotonic()
    r = session.run("while True: pass")
    assert r.status == ExecStatus.TIMEOUT
    assert time.monotonic() - t < 2.0 + 1.0


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
    marker = tmp_path / "alive"
    child = f"import time; time.sleep(1.5); open({str(marker)!r}, 'w')"
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\nprint('started')"
    r = session.run(code)
    assert r.status == ExecStatus.OK, r
    time.sleep(2.0)
    assert not marker.exists()


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
