"""Argument helpers shared by the commands."""

from __future__ import annotations

import json
from typing import Any


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
