"""Isolated by default: an env built without a sandbox runs its code in Docker where an engine answers, else in
bubblewrap, else in plain subprocesses with a warning that says why and what that exposes; ``$MAPPA_SANDBOX``
names another default; where the isolating backends are required (``$MAPPA_REQUIRE_BACKENDS``, CI) a missing one is
an error, not a skip."""

from __future__ import annotations

import time
import warnings

import pytest

import sandboxes
from sandboxes import IsolationWarning, Limits, default_backend, make_sandbox
from sandboxes.check import missing_required, required

from .support import skip_unless


@pytest.mark.docker
@pytest.mark.slow  # a real container
def test_mathchat_made_without_a_sandbox_runs_its_blocks_in_docker(monkeypatch):
    """``mappa_envs.make("mappa/MathChat-v0")`` as a user writes it: the blocks run in a container, as uid 65534
    with no network; a block that stops or kills the processes around it stops neither the host nor the next block."""
    skip_unless("docker")
    monkeypatch.delenv("MAPPA_SANDBOX", raising=False)
    import mappa_envs

    env = mappa_envs.make("mappa/MathChat-v0", tasks=[{"prompt": "6*7?", "answer": "42"}], code_executor_turns=3)
    env.reset(seed=0)
    assert env.unwrapped.record.metadata["sandbox"] == "docker"
    env.step("42")
    hostile = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nos.kill(-1, signal.SIGKILL)\nprint('alive')"
    start = time.monotonic()
    env.step(f"```python\n{hostile}\n```")
    assert time.monotonic() - start < 30  # the host program was not stopped
    env.step("```python\nimport os, socket\nprint(6 * 7, os.getuid(), socket.if_nameindex())\n```")
    first, second = (a.tool_calls[0].result for a in env.unwrapped.record.actions[-2:])
    assert first.backend.startswith("docker/") and second.backend.startswith("docker/")
    out = second.stdout.split(maxsplit=2)
    assert second.ok and out[:2] == ["42", "65534"] and "eth" not in out[2], second  # loopback only: no network
    env.close()


def test_auto_falls_back_to_subprocesses_with_a_warning_that_says_why(monkeypatch):
    import sandboxes.docker_backend as docker_backend

    monkeypatch.setattr(docker_backend, "engine_available", lambda: False)

    def no_bwrap(**kwargs):
        raise RuntimeError("bwrap not installed")

    monkeypatch.setitem(sandboxes._BACKENDS, "bubblewrap", no_bwrap)
    monkeypatch.setattr(sandboxes, "_bubblewrap", no_bwrap)
    with pytest.warns(IsolationWarning) as caught:
        sb = make_sandbox("auto", limits=Limits(timeout_s=5))
    text = str(caught[0].message)
    assert sb.name == "subprocess" and not sb.isolated
    assert "docker: no engine answers" in text and "bwrap not installed" in text  # why
    assert "your files, network and processes" in text and "sandbox='subprocess'" in text  # what it exposes


def test_the_default_backend_is_auto_unless_named(monkeypatch):
    monkeypatch.delenv("MAPPA_SANDBOX", raising=False)
    assert default_backend() == "auto"
    monkeypatch.setenv("MAPPA_SANDBOX", "subprocess")
    assert default_backend() == "subprocess"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a backend chosen on purpose warns about nothing
        assert make_sandbox().name == "subprocess"
    monkeypatch.setenv("MAPPA_SANDBOX", "dockr")
    with pytest.raises(ValueError, match="MAPPA_SANDBOX='dockr' is not a sandbox backend"):
        make_sandbox()


def test_which_backends_are_required():
    assert required({}) == ()
    assert required({"CI": "true"}) == ("docker", "bubblewrap")
    assert required({"CI": "true", "MAPPA_REQUIRE_BACKENDS": "none"}) == ()
    assert required({"MAPPA_REQUIRE_BACKENDS": "all"}) == ("docker", "bubblewrap")
    assert required({"MAPPA_REQUIRE_BACKENDS": "bubblewrap"}) == ("bubblewrap",)
    with pytest.raises(ValueError, match="unknown backend"):
        required({"MAPPA_REQUIRE_BACKENDS": "docker,gvisor"})


def test_a_required_backend_that_is_missing_is_named_with_how_to_install_it(monkeypatch):
    monkeypatch.setenv("MAPPA_REQUIRE_BACKENDS", "docker,bubblewrap")
    lines = missing_required({"docker": None, "bubblewrap": "bwrap not installed (apt-get install bubblewrap)"})
    assert len(lines) == 1 and lines[0].startswith("bubblewrap: bwrap not installed") and "To install:" in lines[0]
    monkeypatch.setenv("MAPPA_REQUIRE_BACKENDS", "docker")
    assert missing_required({"docker": None, "bubblewrap": "bwrap not installed"}) == []


@pytest.mark.slow
def test_the_suite_stops_at_once_when_a_required_backend_is_missing(tmp_path):
    """A pytest run with a bubblewrap requirement and a PATH without ``bwrap`` ends before any test, exit code 3,
    saying what is missing; the sandbox set-up's check exits 1 the same way."""
    import os
    import subprocess
    import sys

    empty = tmp_path / "bin"
    empty.mkdir()
    env = dict(os.environ, MAPPA_REQUIRE_BACKENDS="bubblewrap", PATH=str(empty))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_grading.py"]
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "bwrap not installed" in r.stdout + r.stderr and "passed" not in r.stdout
    check = [sys.executable, "-m", "sandboxes", "check"]
    check = subprocess.run(check, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 1 and "bubblewrap: bwrap not installed" in check.stdout, check.stdout
