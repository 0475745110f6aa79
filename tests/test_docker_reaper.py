"""Containers of a driver killed with SIGKILL are reaped; the next run starts normally."""

import signal
import subprocess
import sys
import textwrap

import pytest

from .support import DOCKER_SKIP

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.skipif(bool(DOCKER_SKIP), reason=str(DOCKER_SKIP))]

DRIVER = textwrap.dedent(
    """
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    import mappa_envs

    def episode(i):
        env = mappa_envs.make("mappa/MathChat-v0", tasks=[{"prompt": "1+1?", "answer": "2"}], sandbox="docker")
        env.reset(seed=i)
        env.step("2")
        env.step("```python\\nprint(1 + 1)\\n```")  # half-way: the code executor's container is up
        return env

    with ThreadPoolExecutor(8) as pool:
        envs = list(pool.map(episode, range(20)))
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _containers_of(client, pid):
    from sandboxes.docker_backend import LABEL

    # the low-level listing (no per-container inspect racing with removals)
    return [
        c["Id"]
        for c in client.api.containers(all=True, filters={"label": LABEL})
        if (c.get("Labels") or {}).get("mappa.owner_pid") == str(pid)
    ]


def test_sigkilled_driver_leaves_nothing_after_reap():
    from sandboxes import make_sandbox
    from sandboxes.docker_backend import docker_client

    client = docker_client()
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", line
        assert len(_containers_of(client, proc.pid)) == 20
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(_containers_of(client, proc.pid)) == 20  # SIGKILL: no clean-up could run
    sandbox = make_sandbox("docker")  # creating a sandbox reaps leftovers of dead owners
    assert _containers_of(client, proc.pid) == []
    with sandbox.session() as s:  # and the next run starts normally
        assert s.run("print('fine')").stdout.strip() == "fine"
