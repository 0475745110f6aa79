"""Argument helpers shared by the commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

_TAKES_VALUE: Any = object()


class OldSpelling(argparse.Action):
    """A flag kept from an earlier version, hidden from the help (``help=argparse.SUPPRESS``): it warns with the flag
    that replaces it (``new``) and sets ``value`` (a switch), or, without ``value``, the argument it is given."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", value: Any = _TAKES_VALUE, **kwargs):
        if value is not _TAKES_VALUE:
            kwargs["nargs"] = 0
        super().__init__(option_strings, dest, **kwargs)
        self.value, self.new = value, new

    def __call__(self, parser, namespace, values, option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is an old spelling of {self.new}; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values if self.value is _TAKES_VALUE else self.value)


def key_values(items: list[str], what: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; an item without ``=`` exits naming the option ``what``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def parse_value(value: str) -> Any:
    """A JSON value (``1``, ``true``, ``"small"``), or the text itself when it is not JSON."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def env_args(items: list[str], what: str = "--env-arg") -> dict[str, Any]:
    """``KEY=VALUE`` items with JSON values."""
    return {k: parse_value(v) for k, v in key_values(items, what).items()}


RAY_ADDRESS_HELP = (
    "run the Ray work on this Ray cluster instead of a local one of mappa's own: HOST:PORT of a head started with "
    "`ray start --head`, `auto` (the cluster `ray start` recorded on this machine), ray://HOST:PORT (Ray Client), "
    "or `local` (a local cluster even where RAY_ADDRESS is set). The same as RAY_ADDRESS, which it sets for the "
    "command and its child processes; a cluster with token authentication is joined with the token Ray finds "
    "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token): docs/training.md"
)


def add_ray_address(parser: Any) -> None:
    """``--ray-address`` (:data:`RAY_ADDRESS_HELP`), for the commands that start Ray work."""
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS", help=RAY_ADDRESS_HELP)


def use_ray_address(value: str | None) -> None:
    """Make ``--ray-address`` the command's ``RAY_ADDRESS`` (``local``: none), which its child processes inherit and
    :func:`baselines.ray_learner.cluster.ray_init` reads; nothing when the option is not given."""
    if value is None:
        return
    if value.strip() in ("", "local"):
        os.environ.pop("RAY_ADDRESS", None)
        os.environ.pop("MAPPA_RAY_ADDRESS_FROM", None)
    else:  # and where it came from, for the messages (baselines.ray_learner.ray_connect.target)
        os.environ["RAY_ADDRESS"] = value.strip()
        os.environ["MAPPA_RAY_ADDRESS_FROM"] = "--ray-address"
