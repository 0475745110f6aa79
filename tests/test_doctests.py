"""The usage examples in module docstrings run."""

import doctest
import importlib

import pytest

MODULES = [
    "mappa_envs",
    "mappa_envs.grading",
    "sandboxes",
    "mappa_envs.tasks.dsbench.metrics",
    "mappa_envs.tasks.dsbench.reference",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
