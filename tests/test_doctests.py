"""The usage examples in module docstrings run."""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules_with_examples() -> list[str]:
    """Every module of the four packages whose source holds a ``>>>`` example (found, not listed by hand)."""
    names = []
    for package in ("sandboxes", "mappa_envs", "baselines", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text():
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
