"""What the tests share that is not a fixture: why a sandbox backend cannot run here (None when it can), parameters
that skip by backend name, and a coach that counts its calls."""

from __future__ import annotations

from sandboxes.check import bubblewrap_problem, docker_problem

DOCKER_SKIP = docker_problem()
"""Why the Docker backend's tests are skipped here, or None (an engine answers and the sandbox image exists). Where
Docker is required (``$MAPPA_REQUIRE_BACKENDS``, CI) the suite fails at start instead (tests/conftest.py)."""
BWRAP_SKIP = bubblewrap_problem()
"""Why the bubblewrap backend's tests are skipped here, or None (bwrap, the sandbox rootfs and the seccomp filter
exist). Required (``$MAPPA_REQUIRE_BACKENDS``, CI): the suite fails at start instead."""
SKIPS = {"subprocess": None, "docker": DOCKER_SKIP, "bubblewrap": BWRAP_SKIP}


def backend_param(backend: str, *values, id: str | None = None):
    """``pytest.param(*values or (backend,))`` that skips, by name and with the reason, where ``backend`` cannot run
    (and carries the ``docker`` marker for Docker): a missing backend shows as a skipped case, never as a shorter
    parameter list."""
    import pytest

    why = SKIPS[backend]
    marks = [*([pytest.mark.docker] if backend == "docker" else []), pytest.mark.skipif(bool(why), reason=str(why))]
    return pytest.param(*(values or (backend,)), id=id or backend, marks=marks)


def skip_unless(backend: str) -> None:
    """Skip the running test, with the reason, where ``backend`` cannot run."""
    import pytest

    if SKIPS[backend]:
        pytest.skip(SKIPS[backend])


class CountingCoach:
    """Wraps a coach (default the rule coach): counts its calls and raises at call ``fail_at``, as a killed process
    stops (re-scoring and resume tests)."""

    def __init__(self, inner=None, fail_at: int | None = None):
        import threading

        from mappa_envs.coach import RuleBasedCoach

        self.inner = inner if inner is not None else RuleBasedCoach()
        self.fail_at, self.calls, self.lock = fail_at, 0, threading.Lock()

    def evaluate(self, inp):
        with self.lock:
            self.calls += 1
            if self.fail_at is not None and self.calls >= self.fail_at:
                raise KeyboardInterrupt("killed")
        return self.inner.evaluate(inp)


RAY_OWNER = "MAPPA_TEST_RAY_ROOT"
"""The environment variable that marks the Ray processes a test started (:class:`RayStartNodes`); its value is the
nodes' folder."""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayStartNodes:
    """Ray nodes started as a user starts them: ``ray start --head``, then nodes joined with ``ray start --address``,
    on the loopback address, in a folder of their own (``root``, short: Ray's socket paths must stay under ~107
    characters).

    They share the machine with other Ray users, so they never touch what is not theirs: each node gets its own
    ``--temp-dir`` under ``root`` (where ``ray start`` records the cluster, instead of
    ``/tmp/ray/ray_current_cluster``), its own ports, and :meth:`stop` ends only the processes marked as started here
    (:data:`RAY_OWNER` in their environment, or ``root`` on their command line) and their children, one by one:
    never ``ray stop``, which ends every Ray process of the machine. ``env``: the nodes' environment (``HOME``
    decides which token ``ray start`` finds)."""

    def __init__(self, root, env: dict[str, str]):
        from pathlib import Path

        self.root = Path(root)
        self.temp_dir = self.root / "ray"
        self.env = {**env, RAY_OWNER: str(self.root), "RAY_USAGE_STATS_ENABLED": "0"}
        self.address: str | None = None
        self.dashboard: str | None = None

    def _ray_start(self, *args: str, timeout: float = 120) -> None:
        import subprocess
        import sys
        from pathlib import Path

        ray = str(Path(sys.executable).with_name("ray"))
        common = ["--temp-dir", str(self.temp_dir), "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
        common += ["--dashboard-agent-listen-port", str(free_port()), "--log-style", "record"]
        done = subprocess.run(
            [ray, "start", *args, *common], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def start_head(self, num_cpus: int, resources: dict[str, float], dashboard: bool = False, **kw) -> str:
        """``ray start --head`` (with the dashboard, and so the job server, if ``dashboard``); the address. A head that
        times out during start-up (a busy machine: seen once here with the load at 11 on 2 cores) is stopped and
        started once more."""
        import json

        for attempt in (1, 2):
            port = free_port()
            args = ["--head", "--port", str(port), "--num-cpus", str(num_cpus), "--resources", json.dumps(resources)]
            args += ["--ray-client-server-port", str(free_port())]
            if dashboard:
                self.dashboard = f"http://127.0.0.1:{free_port()}"
                args += ["--include-dashboard", "true", "--dashboard-port", self.dashboard.rsplit(":", 1)[1]]
            else:
                args += ["--include-dashboard", "false"]
            if kw.get("object_store_memory"):
                args += ["--object-store-memory", str(kw["object_store_memory"])]
            try:
                self._ray_start(*args)
                break
            except RuntimeError as err:
                if attempt == 2 or "timed out during startup" not in str(err):
                    raise
                self.stop()
        self.address = f"127.0.0.1:{port}"
        return self.address

    def join(self, num_cpus: int, resources: dict[str, float], env: dict[str, str] | None = None, **kw) -> None:
        """``ray start --address HEAD``: a second node (``env``: what this node's environment adds)."""
        import json

        assert self.address, "start_head first"
        args = ["--address", self.address, "--num-cpus", str(num_cpus), "--resources", json.dumps(resources)]
        if kw.get("object_store_memory"):
            args += ["--object-store-memory", str(kw["object_store_memory"])]
        saved = self.env
        self.env = {**saved, **(env or {})}
        try:
            self._ray_start(*args)
        finally:
            self.env = saved

    def processes(self) -> list[int]:
        """The ids of the processes started here, and of their children."""
        from pathlib import Path

        marks = (f"{RAY_OWNER}={self.root}\0".encode(), str(self.root).encode())
        parent: dict[int, int] = {}
        ours: set[int] = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
                parent[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                environ, cmdline = (proc / "environ").read_bytes(), (proc / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if marks[0] in environ + b"\0" or marks[1] in cmdline:
                ours.add(int(proc.name))
        grew = True
        while grew:
            children = {pid for pid, ppid in parent.items() if ppid in ours} - ours
            ours |= children
            grew = bool(children)
        import os

        pid = os.getpid()  # never this process or those above it (a shell whose command line names ``root``)
        while pid > 1:
            ours.discard(pid)
            pid = parent.get(pid, 1)
        return sorted(ours)

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """End the processes started here (TERM, then KILL after ``grace_s``); the ids of those that outlived both."""
        import os
        import signal
        import time

        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.processes()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
            if not pids:
                return []
        return self.processes()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
