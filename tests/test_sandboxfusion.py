"""The SandboxFusion-compatible client against a real HTTP server speaking the same protocol.

The server is mappa's own ``/run_code`` endpoint (``sandboxes.fusion_server``), backed by the subprocess backend and
by bubblewrap where it is available; the SandboxFusion service itself cannot be installed offline here.
"""

import pytest

from sandboxes import ExecStatus, Limits, make_sandbox
from sandboxes.fusion_server import serve_in_thread

from .support import BWRAP_SKIP


@pytest.fixture(scope="module", params=["subprocess", "bubblewrap"])
def url(request):
    """The service over each backend (the bubblewrap one is a real container: ``slow``, see conftest.py)."""
    if request.param == "bubblewrap" and BWRAP_SKIP:
        pytest.skip(BWRAP_SKIP)
    server, url = serve_in_thread(make_sandbox(request.param, limits=Limits(timeout_s=5)))
    yield url
    server.shutdown()


@pytest.fixture
def session(url):
    with make_sandbox("sandboxfusion", url=url, limits=Limits(timeout_s=2)).session() as s:
        yield s


def test_workspace_round_trips_through_the_stateless_service(session):
    r = session.run("open('a.txt', 'w').write('hi')\nprint(6 * 7)")
    assert r.status == ExecStatus.OK and r.stdout == "42\n"
    assert [(c.path, c.change) for c in r.files_changed] == [("a.txt", "created")]
    r = session.run("import os\nprint(open('a.txt').read())\nos.remove('a.txt')\nopen('b.txt', 'w').write('b')")
    assert r.stdout == "hi\n"
    assert sorted((c.path, c.change) for c in r.files_changed) == [("a.txt", "deleted"), ("b.txt", "created")]
    r = session.run("print(sorted(__import__('os').listdir('.')))")
    assert r.stdout.strip() == "['b.txt']" and r.files_changed == []  # unchanged files are not rewritten


def test_links_from_the_service_are_not_materialised(session):
    session.run("import os\nos.symlink('/etc/passwd', 'evil')\nopen('ok.txt', 'w').write('1')")
    assert not (session.workspace / "evil").exists() and (session.workspace / "ok.txt").read_text() == "1"


def test_errors_and_timeouts(session):
    r = session.run("1/0")
    assert r.status == ExecStatus.ERROR and "ZeroDivisionError" in r.stderr
    r = session.run("open('lost.txt', 'w').write('x')\nwhile True: pass")
    assert r.status == ExecStatus.TIMEOUT and "lost" in r.error
    assert not (session.workspace / "lost.txt").exists()


def test_unreachable_service_is_an_error_result_not_an_exception():
    with make_sandbox("sandboxfusion", url="http://127.0.0.1:9", request_grace_s=1).session() as s:
        r = s.run("print(1)")
    assert r.status == ExecStatus.ERROR and "unreachable" in r.error


def test_api_key_only_from_the_environment(url, monkeypatch):
    sb = make_sandbox("sandboxfusion", url=url, api_key_env="MAPPA_TEST_FUSION_KEY")
    with sb.session() as s:
        r = s.run("print(1)")
        assert r.status == ExecStatus.ERROR and "MAPPA_TEST_FUSION_KEY" in r.error
        monkeypatch.setenv("MAPPA_TEST_FUSION_KEY", "k")
        assert s.run("print(1)").stdout == "1\n"


def test_explicit_env_goes_with_the_code_and_host_variables_do_not(url, monkeypatch):
    monkeypatch.setenv("HOST_SECRET", "sk-do-not-leak")
    sb = make_sandbox("sandboxfusion", url=url, limits=Limits(timeout_s=5))
    probe = "import os\nprint(os.environ.get('MAPPA_SEED'), os.environ.get('HOST_SECRET'))\nraise SystemExit(3)"
    with sb.session(env={"MAPPA_SEED": "7"}) as s:
        r = s.run(probe)
        assert r.stdout.split() == ["7", "None"] and r.exit_code == 3, (r.stdout, r.stderr)
        assert s.run(probe, env={"MAPPA_SEED": "8"}).stdout.split()[0] == "8"
        # the variables are set before the block; its line numbers are its own
        r = s.run("x = 1\nraise ValueError('line two')")
        assert "line 2" in r.stderr, r.stderr
