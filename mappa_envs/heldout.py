"""Held-out tasks: how a registered environment is evaluated, declared by the task itself.

Each task class says which constructor arguments build its held-out version from its training arguments
(:meth:`mappa_envs.core.PipelineEnv.heldout_kwargs`); :func:`heldout_env_kwargs` looks that up for an env id.

==================  ======================================================================================
env                 held-out version
==================  ======================================================================================
MathChat-v0         the split asked for (``TrainConfig.eval_split``, e.g. ``arith-eval``); without one,
                    the eval split of the training split (``aime-train`` -> ``aime-eval-32``, ...)
DSBench-v0          split ``eval`` of the same suite and data folder when training on split ``train`` (or the
                    split asked for, ``train`` or ``eval``; another name, such as MathChat's ``arith-eval``
                    that ``TrainConfig.eval_split`` defaults to, is ignored); none when training on ``all``
SQLQuery-v0         split ``eval`` (same seed) when training on ``train``: its held-out questions (see
                    :mod:`mappa_envs.tasks.sql_query`); other split names are ignored, as for DSBench
==================  ======================================================================================

>>> heldout_env_kwargs("mappa/DSBench-v0", {"suite": "lite", "split": "train", "sandbox": "subprocess"})
{'suite': 'lite', 'split': 'eval', 'sandbox': 'subprocess'}
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from .core import PipelineEnv
from .registry import _load, make, spec
from .sealed import is_sealed


class NoHeldOutTasks(ValueError):
    """The environment declares no held-out tasks for these training arguments."""


def pick_split(
    env_id: str,
    requested: str | None,
    *,
    train: str | None,
    splits: Sequence[str],
    default: str | None,
    strict: bool = False,
) -> str | None:
    """The held-out split of a task with named ``splits``: ``requested`` when it is one of them, else ``default``.

    A requested name that is not one of ``splits`` raises with ``strict`` (the task owns the name space, like
    MathChat's ``eval_split``), else it is ignored with a warning (it was meant for another task). The training
    split itself is refused: it is not held out.
    """
    if requested is not None and requested not in splits:
        if strict:
            raise ValueError(f"{env_id} has no split {requested!r}; its splits: {list(splits)}")
        if default is not None:
            warnings.warn(
                f"{env_id} has no split {requested!r} (its splits: {list(splits)}); evaluating its held-out split "
                f"{default!r} instead",
                stacklevel=4,  # the caller of heldout_env_kwargs
            )
        requested = None
    chosen = requested if requested is not None else default
    if chosen is not None and chosen == train:
        raise ValueError(f"{env_id}: the evaluation split {chosen!r} is the training split; it is not held out")
    return chosen


def task_class(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> type[PipelineEnv] | None:
    """The task class of ``env_id``: its entry point, or for a factory function the class of the env it builds
    (built once, with ``env_kwargs``); None when that is not a :class:`~mappa_envs.core.PipelineEnv`."""
    s = spec(env_id)
    cls = _load(s.entry_point)
    if not (isinstance(cls, type) and issubclass(cls, PipelineEnv)):  # a factory function: the class it builds
        env = make(env_id, **{**s.kwargs, **(env_kwargs or {})})
        try:
            cls = type(env.unwrapped)
        finally:
            env.close()
    return cls if issubclass(cls, PipelineEnv) else None


def heldout_env_kwargs(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, eval_split: str | None = None, *, unseal: bool = False
) -> dict:
    """The arguments of ``make(env_id, **...)`` that build the held-out version of ``make(env_id, **env_kwargs)``.

    ``eval_split``: the held-out split asked for (``TrainConfig.eval_split``); tasks with named splits use it, or
    refuse a name that is theirs to give, others ignore it. A sealed test split (:mod:`mappa_envs.sealed`) gets
    ``unseal=True`` only when ``unseal`` is (its env refuses to be built otherwise). Raises
    :class:`NoHeldOutTasks` when the task declares none (:meth:`~mappa_envs.core.PipelineEnv.heldout_kwargs`
    returns None, or the env is not a ``PipelineEnv``).
    """
    train = {**spec(env_id).kwargs, **(env_kwargs or {})}
    cls = task_class(env_id, train)
    kwargs = cls.heldout_kwargs(train, eval_split) if cls is not None else None
    if kwargs is None:
        raise NoHeldOutTasks(
            f"{env_id} declares no held-out tasks for env_kwargs={dict(env_kwargs or {})!r}, so it cannot be "
            "evaluated: train on a split that has held-out tasks (e.g. DSBench-v0: split='train'; see "
            "mappa_envs.heldout), set eval_episodes=0 (--eval-episodes 0), or give the task held-out tasks "
            "(PipelineEnv.heldout_kwargs, see docs/adding-a-task.md)"
        )
    kwargs = {k: v for k, v in kwargs.items() if k != "unseal"}
    if unseal and is_sealed(env_id, kwargs):
        kwargs["unseal"] = True
    return kwargs


__all__ = ["NoHeldOutTasks", "heldout_env_kwargs", "pick_split", "task_class"]
