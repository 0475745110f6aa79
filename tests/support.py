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
