"""Environment registry: ``make("mappa/MathChat-v0", **kwargs)``, ``register(...)``, ``registry``.

Ids follow Gymnasium's ``namespace/Name-vN`` form. Third-party packages can register environments through the
``mappa_envs.envs`` entry-point group: each entry point names a callable that calls :func:`register`; they are
loaded on the first :func:`make` or listing.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

_ID = re.compile(r"^(?:[\w.-]+/)?[\w.:-]+-v\d+$")
ENTRY_POINT_GROUP = "mappa_envs.envs"


@dataclass(frozen=True)
class EnvSpec:
    """How to build a registered environment."""

    id: str
    entry_point: str | Callable[..., Any]
    """``"package.module:ClassName"`` or a callable returning an env."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Default constructor arguments (overridden by ``make``'s keyword arguments)."""
    description: str = ""

    def make(self, **kwargs: Any) -> Any:
        factory = _load(self.entry_point)
        env = factory(**{**self.kwargs, **kwargs})
        try:
            env.spec = self
        except AttributeError:
            pass
        return env


registry: dict[str, EnvSpec] = {}
_plugins_loaded = False


def _load(entry_point: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(entry_point):
        return entry_point
    module, _, attr = entry_point.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    kwargs: dict[str, Any] | None = None,
    description: str = "",
    *,
    override: bool = False,
) -> EnvSpec:
    """Register an environment id. Re-registering an id raises unless ``override=True``."""
    if not _ID.match(id):
        raise ValueError(f"invalid env id {id!r}: expected 'namespace/Name-vN'")
    if id in registry and not override:
        raise ValueError(f"env id {id!r} is already registered (pass override=True to replace it)")
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs or {}), description=description)
    registry[id] = spec
    return spec


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()()


def spec(id: str) -> EnvSpec:
    _load_plugins()
    try:
        return registry[id]
    except KeyError:
        close = [k for k in registry if k.split("/")[-1].split("-v")[0] in id]
        hint = f"; did you mean {close}?" if close else f"; registered: {sorted(registry)}"
        raise KeyError(f"no environment registered as {id!r}{hint}") from None


def make(id: str, **kwargs: Any) -> Any:
    """Build a registered environment, e.g. ``make("mappa/MathChat-v0", split="amc-eval-32")``."""
    return spec(id).make(**kwargs)


def list_envs() -> list[EnvSpec]:
    """All registered environments, sorted by id."""
    _load_plugins()
    return [registry[k] for k in sorted(registry)]
