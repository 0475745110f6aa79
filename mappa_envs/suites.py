"""Evaluation suites: what ``mappa eval --suites NAME`` evaluates, found in the registry and each task's declarations.

Every registered environment can be evaluated; a suite is an env id with its constructor arguments. The names:

==========================  ==========================================================================================
``<suite>``                 a named suite a task declares (:attr:`~mappa_envs.core.PipelineEnv.eval_suites`): ``aime``,
                            ``amc`` (MathChat's AIME-32, AMC-32), ``dsbench`` (DSBench-lite's eval split)
``<task>``                  the task's held-out tasks, as it declares them for its default training arguments
                            (:meth:`~mappa_envs.core.PipelineEnv.heldout_kwargs`): ``sql`` (SQLQuery's split ``eval``)
``<task>:<split>``          the task on that split (:meth:`~mappa_envs.core.PipelineEnv.suite_kwargs`): ``sql:eval``,
                            ``mathchat:arith1-eval``, ``dsbench:train``; MathChat takes a task file there too
                            (``tasks:<file>``, what ``mappa eval --tasks FILE`` adds)
``<env id>[:<split>]``      the same by the registered id, e.g. ``mappa/SQLQuery-v0:eval``: always unambiguous
==========================  ==========================================================================================

A task's names are its :attr:`~mappa_envs.core.PipelineEnv.eval_names` (``sql``; ``mathchat`` and ``tasks``), by
default its registered id's name in lower case (``theirpkg/Echo-v0``: ``echo``; a factory function's env always so).
A named suite goes before a task's name; a name two registered envs claim belongs to the one registered first (the
built-in tasks, then plugins); the other is reached by its id. Sealed splits (:mod:`mappa_envs.sealed`) are the
evaluating code's to refuse or unseal (:func:`baselines.evaluation.evaluate.suite_env`).

>>> resolve_suite("sql:eval")
Suite(name='sql:eval', env_id='mappa/SQLQuery-v0', kwargs={'split': 'eval'}, task='sql')
>>> resolve_suite("sql") == resolve_suite("mappa/SQLQuery-v0")._replace(name="sql")
True
>>> resolve_suite("amc").kwargs
{'split': 'amc-eval-32'}
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

from .heldout import NoHeldOutTasks, heldout_env_kwargs, task_class
from .registry import _load, list_envs, registry


class Suite(NamedTuple):
    """An evaluation suite: ``make(env_id, **kwargs)``, under its name."""

    name: str
    env_id: str
    kwargs: dict[str, Any]
    task: str
    """The task's name (the first of its names): extra arguments for every suite of a task are keyed by it."""


def task_names(env_id: str) -> tuple[str, ...]:
    """The names ``env_id``'s task has in suites: its ``eval_names``, else its id's name in lower case."""
    cls = _class_of(env_id)
    return tuple(getattr(cls, "eval_names", ())) or (env_id.rpartition("/")[2].rsplit("-v", 1)[0].lower(),)


LOAD_ERRORS: dict[str, str] = {}
"""Registered env ids whose entry point failed to load when suites were listed -> the error (each also warned once,
and named when a suite is not found): such an env is left out of the names, never silently."""


def _class_of(env_id: str) -> type | None:
    """The class ``env_id`` is registered with (None for a factory function or an entry point that does not load:
    such an env is found by its id, and ``make`` says what is wrong with it)."""
    try:
        cls = _load(registry[env_id].entry_point)
    except Exception as e:  # a plugin that fails to load must not hide the other suites, nor be hidden itself
        error = f"{type(e).__name__}: {e}"
        if LOAD_ERRORS.get(env_id) != error:
            warnings.warn(
                f"env {env_id!r}: its entry point {registry[env_id].entry_point!r} failed to load ({error}); its "
                "suites are left out",
                RuntimeWarning,
                stacklevel=2,
            )
        LOAD_ERRORS[env_id] = error
        return None
    LOAD_ERRORS.pop(env_id, None)
    return cls if isinstance(cls, type) else None


def _names() -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, str]]:
    """The named suites (name -> env id, arguments) and the tasks' names (name -> env id), the first registered
    env having a name claimed twice."""
    list_envs()  # the plugins' envs too
    named: dict[str, tuple[str, dict[str, Any]]] = {}
    tasks: dict[str, str] = {}
    for env_id in list(registry):
        for name in task_names(env_id):
            tasks.setdefault(name, env_id)
        for name, kwargs in getattr(_class_of(env_id), "eval_suites", {}).items():
            named.setdefault(name, (env_id, dict(kwargs)))
    return named, tasks


def suite_names() -> list[str]:
    """What ``--suites`` takes: the named suites, then ``<task>:<split>`` for each task name (``<task>`` alone: its
    held-out tasks), then the ids."""
    named, tasks = _names()
    return [*named, *(f"{name}[:<split>]" for name in tasks), *(f"{env_id}[:<split>]" for env_id in registry)]


def resolve_suite(suite: str) -> Suite:
    """The env id and arguments of ``suite`` (see the module docstring). Raises ValueError for an unknown name or a
    task that declares no held-out tasks named without a split."""
    list_envs()
    for env_id in list(registry):
        if suite == env_id or suite.startswith(env_id + ":"):
            return _task_suite(suite, env_id, suite[len(env_id) + 1 :])
    named, tasks = _names()
    if suite in named:
        env_id, kwargs = named[suite]
        return Suite(suite, env_id, kwargs, task_names(env_id)[0])
    name, colon, split = suite.partition(":")
    if name in tasks and (split or not colon):
        return _task_suite(suite, tasks[name], split)
    broken = "".join(f"; {env_id} failed to load ({error})" for env_id, error in LOAD_ERRORS.items())
    raise ValueError(f"unknown suite {suite!r}; suites: {', '.join(suite_names())}{broken}")


def _task_suite(suite: str, env_id: str, split: str) -> Suite:
    """Suite ``<task>:<split>`` (the task's ``suite_kwargs``), or with no split ``<task>`` (its held-out tasks)."""
    if split:
        cls = task_class(env_id)
        kwargs = cls.suite_kwargs(split) if cls is not None else {"split": split}
    else:
        try:
            kwargs = heldout_env_kwargs(env_id)
        except NoHeldOutTasks:
            raise ValueError(
                f"suite {suite!r}: {env_id} declares no held-out tasks (PipelineEnv.heldout_kwargs); name a split: "
                f"{suite}:<split>"
            ) from None
    return Suite(suite, env_id, dict(kwargs), task_names(env_id)[0])


__all__ = ["Suite", "resolve_suite", "suite_names", "task_names"]
