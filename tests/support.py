"""What the tests share that is not a fixture: why a sandbox backend cannot run here (None when it can), and a coach
that counts its calls."""

from __future__ import annotations


def _docker_reason() -> str | None:
    try:
        from sandboxes.docker_backend import engine_available
        from sandboxes.image import DEFAULT_IMAGE, image_exists
    except Exception as e:  # the docker SDK is missing
        return f"docker SDK unavailable: {e}"
    if not engine_available():
        return "no Docker engine could be reached (make test starts one where root and apt are available)"
    if not image_exists(DEFAULT_IMAGE):
        return f"sandbox image {DEFAULT_IMAGE} missing: python -m sandboxes build"
    return None


def _bwrap_reason() -> str | None:
    import shutil

    from sandboxes.image import rootfs_dir

    if shutil.which("bwrap") is None:
        return "bwrap not installed (apt-get install bubblewrap)"
    if not (rootfs_dir() / "usr/bin/python3").exists():
        return f"no sandbox rootfs at {rootfs_dir()}: python -m sandboxes build --rootfs-only"
    return None


DOCKER_SKIP = _docker_reason()
"""Why the Docker backend's tests are skipped here, or None (an engine answers and the sandbox image exists)."""
BWRAP_SKIP = _bwrap_reason()
"""Why the bubblewrap backend's tests are skipped here, or None (bwrap and the sandbox rootfs exist)."""


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
