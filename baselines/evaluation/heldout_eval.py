"""The held-out evaluation a training run makes before and after it trains (``mappa train``'s ``eval.json``): the
same problems, each ``eval_samples`` times, with per-episode outcomes for the paired test."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import mappa_envs
from baselines.config import TrainConfig
from baselines.evaluation.rollout import run_episodes
from baselines.weights.policies import Policy
from mappa_envs.heldout import heldout_env_kwargs
from mappa_envs.metrics import accuracy, role_behaviour, role_stats
from mappa_envs.sealed import code_version, log_access


def evaluate_heldout(
    cfg: TrainConfig,
    policies: Callable[[], Mapping[str, Policy]],
    split: str | None,
    episodes: int,
    *,
    seed: int = 123,
    samples: int | None = None,
) -> dict[str, Any]:
    """Held-out episodes with the policies ``policies()`` makes (called once the held-out tasks are known: a task
    without any raises before an engine is asked), played at ``cfg.eval_temperature``, no coach: tasks 0..episodes-1 of
    the held-out version of the training env, as its task declares it (:func:`mappa_envs.heldout.
    heldout_env_kwargs`), each ``samples`` times (default ``cfg.eval_samples``; episode seeds differ).
    ``split`` (``cfg.eval_split``) picks the held-out split of a task with named splits; a task without ignores
    it. Each held-out task is one problem: ``episodes`` is capped at their number. Raises
    :class:`mappa_envs.heldout.NoHeldOutTasks` when the task declares none."""
    k = samples or cfg.eval_samples
    kwargs = heldout_env_kwargs(cfg.env_id, cfg.env_kwargs, split, unseal=cfg.unseal_test)
    episodes, tool_role, categories = _probe_heldout(cfg.env_id, kwargs, episodes)
    t0 = time.perf_counter()
    records = run_episodes(
        lambda: mappa_envs.make(cfg.env_id, **kwargs),
        policies(),
        episodes * k,
        seed=seed,
        concurrency=cfg.concurrency,
        reset_options=lambda i: {"task_index": i // k},
    )
    correct, n = accuracy(records)
    if kwargs.get("unseal"):
        log_access(cfg.env_id, kwargs["split"], episodes=n, correct=correct, result_file=f"{cfg.out_dir}/eval.json")
    stats = role_stats(records)
    ce = stats.get(tool_role) if tool_role else None
    quality = [r.quality for r in records if r.quality is not None]
    extra = {"mean_quality": sum(quality) / len(quality)} if quality else {}
    return {
        **extra,
        "split": kwargs.get("split"),  # the held-out split evaluated (None: a task without named splits)
        "accuracy": correct / n if n else 0.0,
        "correct": correct,
        "episodes": n,
        "problems": episodes,
        "samples_per_problem": k,
        "tool_role": tool_role,  # the first role with tools: the one code_rate and tool_success_rate describe
        "code_rate": ce.code_rate if ce else 0.0,
        "tool_success_rate": ce.tool_success_rate if ce else 0.0,
        "behaviour": role_behaviour(records),
        "task_ids": [r.task_id for r in records],
        # per episode: its problem's category (a MathChat arithmetic problem's operations), for per-category tables
        "categories": [categories[i // k] for i in range(len(records))],
        # per episode, in order (problem i // k, sample i % k): what a paired test before/after compares
        "outcomes": [r.success for r in records],
        # per episode, where the task grades leniently too (MathChat: an unboxed final number also counts): None
        "lenient_outcomes": _lenient(records),
        "seconds": round(time.perf_counter() - t0, 1),
        "code_version": code_version(),  # the commit that evaluated it (+dirty: with uncommitted changes)
    }


def _probe_heldout(env_id: str, kwargs: dict[str, Any], episodes: int) -> tuple[int, str | None, list[str]]:
    """What the evaluation needs to know of the held-out env before it plays it: ``episodes``, or the number of
    held-out tasks when there are fewer (with a warning: each is evaluated once); the team's first role with
    tools (MathChat's code executor), or None; each task's category (its metadata's ``op``, else ``kind``, else
    ``"all"``)."""
    probe = mappa_envs.make(env_id, **kwargs)
    tasks = probe.unwrapped.tasks
    n_tasks = len(tasks)
    tool_role = next((r.name for r in probe.unwrapped.roles if r.tools), None)
    categories = [str(t.metadata.get("op", t.metadata.get("kind", "all"))) for t in tasks]
    probe.close()
    if episodes > n_tasks:
        warnings.warn(
            f"{episodes} evaluation episodes asked for, but {env_id} has {n_tasks} held-out tasks ({kwargs}): "
            "evaluating each once",
            stacklevel=3,
        )
        return n_tasks, tool_role, categories
    return episodes, tool_role, categories


def _lenient(records: list) -> list[bool] | None:
    """Each episode's ``lenient_correct`` when every episode's outcome has one, else None."""
    found = [r.outcome.get("lenient_correct") if r.outcome is not None else None for r in records]
    return None if not found or any(x is None for x in found) else [bool(x) for x in found]
