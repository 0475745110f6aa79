"""Sandboxed code execution for agent tools.

>>> from sandboxes import make_sandbox
>>> with make_sandbox("subprocess").session() as s:
...     print(s.run("print(6 * 7)").stdout.strip())
42
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .base import ExecResult, ExecStatus, Limits, Sandbox, Session, check_env
from .files import FileChange, UnsafeFileError
from .subprocess_backend import SubprocessSandbox
from .workspaces import reap_workspaces


def _docker(**kwargs: Any) -> Sandbox:
    from .docker_backend import DockerSandbox  # imports the docker SDK only when asked for

    return DockerSandbox(**kwargs)


def _bubblewrap(**kwargs: Any) -> Sandbox:
    from .bubblewrap_backend import BubblewrapSandbox

    return BubblewrapSandbox(**kwargs)


def _sandboxfusion(**kwargs: Any) -> Sandbox:
    from .sandboxfusion_backend import SandboxFusionSandbox

    return SandboxFusionSandbox(**kwargs)


class IsolationWarning(UserWarning):
    """``sandbox="auto"`` found no isolating backend and fell back to plain subprocesses."""


SETUP_COMMAND = "sudo make sandbox"
"""The one command that sets up the isolating backends on a machine with root and apt (scripts/sandbox_setup.sh):
bubblewrap and its rootfs, a Docker engine and the sandbox image."""


def _common(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments every backend takes (the others are Docker's)."""
    return {k: v for k, v in kwargs.items() if k in ("limits", "mode", "preload")}


def _auto_pick(kwargs: dict[str, Any]) -> tuple[Sandbox | None, list[str]]:
    """The sandbox ``auto`` picks (None: no isolating backend works here) and why each better one was passed over."""
    reasons = []
    try:
        from .docker_backend import engine_available
        from .image import DEFAULT_IMAGE, image_exists

        if not engine_available():
            reasons.append("docker: no engine answers")
        elif not image_exists(kwargs.get("image", DEFAULT_IMAGE)):
            reasons.append("docker: the sandbox image is not built (python -m sandboxes build)")
        else:
            return _docker(**kwargs), reasons
    except Exception as e:  # the docker SDK is not installed
        reasons.append(f"docker: {type(e).__name__}: {e}")
    try:
        return _bubblewrap(**_common(kwargs)), reasons
    except Exception as e:
        reasons.append(f"bubblewrap: {type(e).__name__}: {e}")
    return None, reasons


def auto_choice(**kwargs: Any) -> tuple[str, list[str]]:
    """The backend ``sandbox="auto"`` runs here (``docker``, ``bubblewrap`` or ``subprocess``) and why each more
    isolating one was passed over: what ``mappa train`` prints before a run and records in its ``config.json``."""
    sandbox, reasons = _auto_pick(kwargs)
    if sandbox is None:
        return "subprocess", reasons
    name = "docker" if type(sandbox).__name__ == "DockerSandbox" else "bubblewrap"
    sandbox.close()
    return name, reasons


def no_isolation_message(reasons: list[str]) -> str:
    """What is said where no isolating backend can run: why, what that means, and the command that fixes it."""
    return (
        "no isolating sandbox is available (" + "; ".join(reasons) + "): agent code runs in plain subprocesses, as "
        "your user, with your files, network and processes within its reach (only rlimits and a timeout hold). "
        f"`{SETUP_COMMAND}` installs bubblewrap and Docker and builds their rootfs and image (root and apt); "
        "pass sandbox='subprocess' to choose this on purpose."
    )


def auto_backend(**kwargs: Any) -> Sandbox:
    """The most isolating backend that works here: Docker where an engine answers and the sandbox image exists,
    else bubblewrap, else the (not isolating) subprocess backend, with a warning that says why.

    ``limits`` (and ``mode``, ``preload``) are passed to whichever backend is chosen; the other keyword
    arguments only to Docker.
    """
    import warnings

    sandbox, reasons = _auto_pick(kwargs)
    if sandbox is not None:
        return sandbox
    warnings.warn(no_isolation_message(reasons), IsolationWarning, stacklevel=2)
    return SubprocessSandbox(**_common(kwargs))


_BACKENDS: dict[str, Callable[..., Sandbox]] = {
    "auto": auto_backend,
    "sandboxfusion": _sandboxfusion,
    "subprocess": SubprocessSandbox,
    "docker": _docker,
    "bubblewrap": _bubblewrap,
}


def register_backend(name: str, factory: Callable[..., Sandbox]) -> None:
    """Make a backend available to :func:`make_sandbox` (and so to every env's ``sandbox=`` argument)."""
    _BACKENDS[name] = factory


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


DEFAULT_BACKEND_VAR = "MAPPA_SANDBOX"
"""The variable naming the backend used where none is given (an env's ``sandbox=None``, ``make_sandbox()``)."""


def default_backend() -> str:
    """The backend used where none is given: ``$MAPPA_SANDBOX`` when set (e.g. ``subprocess`` for a test suite whose
    tests check the trainer, not the isolation), else ``"auto"``: the most isolating backend that works here."""
    name = os.environ.get(DEFAULT_BACKEND_VAR, "").strip() or "auto"
    if name not in _BACKENDS:
        raise ValueError(f"{DEFAULT_BACKEND_VAR}={name!r} is not a sandbox backend; available: {available_backends()}")
    return name


def make_sandbox(spec: str | Sandbox | None = None, **kwargs: Any) -> Sandbox:
    """Build a sandbox from a backend name (``"docker"``), or pass a ready instance through; None:
    :func:`default_backend` (``"auto"`` unless ``$MAPPA_SANDBOX`` says otherwise)."""
    if spec is None:
        spec = default_backend()
    if isinstance(spec, Sandbox):
        if kwargs:
            raise TypeError("keyword arguments are only accepted with a backend name")
        return spec
    try:
        factory = _BACKENDS[spec]
    except KeyError:
        raise ValueError(f"unknown sandbox backend {spec!r}; available: {available_backends()}") from None
    return factory(**kwargs)


__all__ = [
    "SETUP_COMMAND",
    "ExecResult",
    "ExecStatus",
    "FileChange",
    "IsolationWarning",
    "Limits",
    "Sandbox",
    "Session",
    "SubprocessSandbox",
    "UnsafeFileError",
    "auto_backend",
    "auto_choice",
    "available_backends",
    "check_env",
    "default_backend",
    "make_sandbox",
    "no_isolation_message",
    "reap_workspaces",
    "register_backend",
]
