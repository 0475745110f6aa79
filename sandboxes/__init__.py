"""Sandboxed code execution for agent tools.

>>> from sandboxes import make_sandbox
>>> with make_sandbox("subprocess").session() as s:
...     print(s.run("print(6 * 7)").stdout.strip())
42
"""

from __future__ import annotations

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


def auto_backend(**kwargs: Any) -> Sandbox:
    """The most isolating backend that works here: Docker where an engine answers and the sandbox image exists,
    else bubblewrap, else the (not isolating) subprocess backend, with a warning that says why.

    ``limits`` (and ``mode``, ``preload``) are passed to whichever backend is chosen; the other keyword
    arguments only to Docker.
    """
    import warnings

    common = {k: v for k, v in kwargs.items() if k in ("limits", "mode", "preload")}
    reasons = []
    try:
        from .docker_backend import engine_available
        from .image import DEFAULT_IMAGE, image_exists

        if not engine_available():
            reasons.append("docker: no engine answers")
        elif not image_exists(kwargs.get("image", DEFAULT_IMAGE)):
            reasons.append("docker: the sandbox image is not built (python -m sandboxes build)")
        else:
            return _docker(**kwargs)
    except Exception as e:  # the docker SDK is not installed
        reasons.append(f"docker: {type(e).__name__}: {e}")
    try:
        return _bubblewrap(**common)
    except Exception as e:
        reasons.append(f"bubblewrap: {type(e).__name__}: {e}")
    warnings.warn(
        "no isolating sandbox is available (" + "; ".join(reasons) + "): agent code runs in plain subprocesses",
        stacklevel=2,
    )
    return SubprocessSandbox(**common)


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


def make_sandbox(spec: str | Sandbox = "subprocess", **kwargs: Any) -> Sandbox:
    """Build a sandbox from a backend name (``"subprocess"``), or pass a ready instance through."""
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
    "ExecResult",
    "ExecStatus",
    "FileChange",
    "Limits",
    "Sandbox",
    "Session",
    "SubprocessSandbox",
    "UnsafeFileError",
    "auto_backend",
    "available_backends",
    "check_env",
    "make_sandbox",
    "reap_workspaces",
    "register_backend",
]
