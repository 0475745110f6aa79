"""Which isolating backends can run here, why not, and how to get them: ``python -m sandboxes check``.

:func:`problems` answers per backend (None when it can run). :func:`required` reads which backends must be there:
``$MAPPA_REQUIRE_BACKENDS`` (``docker,bubblewrap``, ``all``, or ``none``), else all of them under CI (``$CI`` set to
a true value), else none. Where a required backend is missing, ``make test`` (scripts/sandbox_setup.sh) and the
test suite fail at once with what is missing and how to install it, instead of skipping every isolation test.
"""

from __future__ import annotations

import os
import shutil

ISOLATING = ("docker", "bubblewrap")
REQUIRE_VAR = "MAPPA_REQUIRE_BACKENDS"

_INSTALL = {
    "docker": "apt-get install docker.io, start the engine (dockerd --iptables=false --bridge=none), then "
    "`python -m sandboxes build`; a non-root user needs the docker group",
    "bubblewrap": "apt-get install bubblewrap libseccomp2 debootstrap, then `python -m sandboxes build --rootfs-only` "
    "(or `make sandbox`, which does both as root)",
}


def docker_problem() -> str | None:
    """Why the Docker backend cannot run here (None: an engine answers and the sandbox image exists)."""
    try:
        from .docker_backend import engine_available
        from .image import DEFAULT_IMAGE, image_exists
    except Exception as e:  # the docker SDK is missing
        return f"docker SDK unavailable: {e} (pip install 'mappa-envs[docker]')"
    if not engine_available():
        return "no Docker engine could be reached (make test starts one where root and apt are available)"
    if not image_exists(DEFAULT_IMAGE):
        return f"sandbox image {DEFAULT_IMAGE} missing: python -m sandboxes build"
    return None


def bubblewrap_problem() -> str | None:
    """Why the bubblewrap backend cannot run here with its system-call filter (None: it can)."""
    from .image import rootfs_dir

    if shutil.which("bwrap") is None:
        return "bwrap not installed (apt-get install bubblewrap)"
    if not (rootfs_dir() / "usr/bin/python3").exists():
        return f"no sandbox rootfs at {rootfs_dir()}: python -m sandboxes build --rootfs-only"
    from .syscall_filter import seccomp_program

    _, why = seccomp_program()
    if why:
        return f"bubblewrap would run without its seccomp filter: {why}"
    return None


def problems() -> dict[str, str | None]:
    """Per isolating backend, why it cannot run here, or None."""
    return {"docker": docker_problem(), "bubblewrap": bubblewrap_problem()}


def required(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The backends that must be available: ``$MAPPA_REQUIRE_BACKENDS`` (a comma list, ``all`` or ``none``), else
    both under CI (``$CI`` true), else none."""
    env = os.environ if environ is None else environ
    raw = env.get(REQUIRE_VAR)
    if raw is None:
        return ISOLATING if env.get("CI", "").strip().lower() in ("1", "true", "yes") else ()
    raw = raw.strip().lower()
    if raw in ("", "0", "none", "no", "false"):
        return ()
    if raw in ("1", "all", "yes", "true"):
        return ISOLATING
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in ISOLATING]
    if unknown:
        raise ValueError(
            f"{REQUIRE_VAR}: unknown backend(s) {unknown}; use a comma list of {list(ISOLATING)}, all or none"
        )
    return names


def missing_required(found: dict[str, str | None] | None = None) -> list[str]:
    """One line per required backend that cannot run: what is missing and how to install it (empty: all there)."""
    found = problems() if found is None else found
    return [f"{name}: {found[name]}. To install: {_INSTALL[name]}" for name in required() if found.get(name)]


def main() -> int:
    """Print each backend's state; exit 1 when a required one is missing."""
    found = problems()
    for name in ISOLATING:
        print(f"{name}: {'ok' if found[name] is None else found[name]}")
    missing = missing_required(found)
    if missing:
        print(f"required by {REQUIRE_VAR} / CI but missing:\n  " + "\n  ".join(missing))
        return 1
    return 0
