"""Pre-flight checks of a training configuration: can it run here, before anything heavy starts?

:func:`check_config` looks at a :class:`~baselines.config.TrainConfig` without loading a model or starting Ray and
returns one :class:`Check` per question:

==============  ===================================================================================================
``model``       the model is on disk (the bundled SmolLM2 package, the generated tiny model, a folder with
                ``config.json``, or a Hugging Face id already in the local cache). Nothing is downloaded and a
                missing model is a failure, never a fall-back to another model.
``tasks``       the training environment can be built and its task pool holds ``prompts_per_iteration`` tasks
                (an environment that cannot be built, e.g. original DSBench without ``data_dir``, fails with the
                reason instead of a traceback)
``eval``        the held-out split can be built and holds ``eval_episodes`` tasks (when ``eval_episodes > 0``)
``estimator``   a known advantage estimator, with the samples per prompt it needs (GRPO's group baseline: 2+)
``options``     every field with a fixed set of values (its ``Literal`` type: ``trainer``, ``truncated``...), the
                options the trainer supports, the ranges of the numbers
``memory``      the estimated peak memory of the whole run against the memory available (skipped with
                ``memory_check=False``); when it does not fit, settings that would (see :func:`suggest_settings`)
==============  ===================================================================================================

``mappa train --dry-run`` prints them; the trainers call :func:`raise_for_failed` on them before starting Ray.

The memory estimate and its calibration are in :mod:`baselines.planning.memory`.
"""

from __future__ import annotations

import importlib.util
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mappa_envs
from baselines.config import TrainConfig, process_reward, run_coach, served_model
from baselines.fields import choice_problems, choices
from baselines.planning.memory import as_flags, estimate_memory, suggest_settings
from baselines.ray_learner.cluster import placement_key_problems
from baselines.ray_learner.ray_connect import target as ray_target
from baselines.runs.offline import source_config
from baselines.weights.models import resolve_model
from baselines.weights.role_weights import effective_role_weights, role_specs, spec_problems
from baselines.weights.shapes import locate_model, model_shape
from mappa_envs.heldout import heldout_env_kwargs

# the estimators (baselines.algorithm.advantages, which imports torch) are imported inside the functions that use them:
# importing this module (the CLI, the checks, a dry run) loads none of them.


@dataclass
class Check:
    """One pre-flight question: its name, whether it passed, and why (or what to do)."""

    name: str
    ok: bool
    detail: str
    data: Any = field(default=None, repr=False, compare=False)
    """Structured result where there is one (the ``memory`` check: its :class:`MemoryEstimate`)."""


# ----------------------------------------------------------------------------------------------- the checks
def _check_model(cfg: TrainConfig) -> tuple[Check, Path | None]:
    try:
        folder, where = locate_model(cfg.model)
    except FileNotFoundError as e:
        return Check("model", False, str(e)), None
    return Check("model", True, f"{cfg.model}: {where}"), folder


def _probe_env(env_id: str, kwargs: dict[str, Any]) -> tuple[list[str], int]:
    env = mappa_envs.make(env_id, **kwargs)
    try:
        return [r.name for r in env.unwrapped.roles], len(env.unwrapped.tasks)
    finally:
        env.close()


def _prompts(env_id: str, kwargs: dict[str, Any]) -> set[str]:
    """The task prompts of an env, compared on letters and digits (as MathChat removes evaluation problems from its
    pools: differently typeset copies count as the same problem)."""
    env = mappa_envs.make(env_id, **kwargs)
    try:
        return {re.sub(r"[^a-z0-9]", "", t.prompt.lower()) for t in env.unwrapped.tasks}
    finally:
        env.close()


def _env_error(env_id: str, kwargs: dict[str, Any], e: Exception) -> str:
    msg = f"cannot build {env_id} with {kwargs}: {type(e).__name__}: {e}"
    if "data_dir" in str(e):
        msg += " (pass it with --env-arg data_dir=/path/to/DSBench)"
    return msg


def _check_tasks(cfg: TrainConfig, roles, n_tasks) -> tuple[Check, list[str] | None]:
    if roles is None or n_tasks is None:
        try:
            roles, n_tasks = _probe_env(cfg.env_id, cfg.env_kwargs)
        except Exception as e:
            return Check("tasks", False, _env_error(cfg.env_id, cfg.env_kwargs, e)), None
    n, k = cfg.prompts_per_iteration, cfg.samples_per_prompt
    if n < 1:
        return Check("tasks", False, f"prompts_per_iteration={n}: must be at least 1"), roles
    if n > n_tasks:
        return Check(
            "tasks",
            False,
            f"prompts_per_iteration={n} > {n_tasks} tasks in the pool of {cfg.env_id} {cfg.env_kwargs}",
        ), roles
    epochs = cfg.iterations * n / n_tasks
    return Check(
        "tasks",
        True,
        f"{n_tasks} tasks, {len(roles)} roles ({', '.join(roles)}); {n} prompts x {k} samples per iteration, "
        f"{cfg.iterations} iterations = {epochs:.2f} passes over the pool",
    ), roles


def _check_eval(cfg: TrainConfig) -> Check | None:
    """The held-out tasks the task declares (``heldout_kwargs``) for ``eval_split`` and ``eval_extra_splits``."""
    if not cfg.eval_episodes:
        return None

    if cfg.eval_samples < 1:
        return Check("eval", False, f"eval_samples={cfg.eval_samples}: must be at least 1")
    found = []
    train_prompts: set[str] | None = None
    for split in (cfg.eval_split, *cfg.eval_extra_splits):  # None: the task's own held-out split
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a split the task does not have is reported by the trainer
                kwargs = heldout_env_kwargs(cfg.env_id, cfg.env_kwargs, split, unseal=cfg.unseal_test)
            _, n_tasks = _probe_env(cfg.env_id, kwargs)
        except Exception as e:
            return Check("eval", False, f"no held-out tasks for {split!r}: {type(e).__name__}: {e}")
        name = kwargs.get("split", split)
        if cfg.eval_episodes > n_tasks:
            return Check("eval", False, f"eval_episodes={cfg.eval_episodes} > {n_tasks} held-out tasks in {name!r}")
        try:
            if train_prompts is None:  # built once, whatever the number of held-out splits
                train_prompts = _prompts(cfg.env_id, cfg.env_kwargs)
            shared = _prompts(cfg.env_id, kwargs) & train_prompts
        except Exception as e:
            return Check("eval", False, _env_error(cfg.env_id, cfg.env_kwargs, e))
        if shared:
            return Check(
                "eval",
                False,
                f"{len(shared)} held-out task(s) of {name!r} are also in the training pool {cfg.env_kwargs}: "
                "they are not held out (pick another --eval-split)",
            )
        found.append(f"{cfg.eval_episodes} of the {n_tasks} tasks of {name!r}")
    return Check("eval", True, f"{'; '.join(found)}; {cfg.eval_samples} sample(s) each")


def _check_estimator(cfg: TrainConfig) -> Check:
    try:
        from baselines.algorithm.advantages import estimator_spec

        spec = estimator_spec(cfg.estimator)  # built-ins and installed plug-ins
    except ImportError:  # torch missing: nothing to train with anyway
        return Check("estimator", False, "the estimators need torch (make setup)")
    except ValueError as e:
        return Check("estimator", False, str(e))
    if cfg.samples_per_prompt < 1:
        return Check("estimator", False, f"samples_per_prompt={cfg.samples_per_prompt}: must be at least 1")
    if cfg.samples_per_prompt < spec.min_samples_per_prompt:
        return Check(
            "estimator",
            False,
            f"{cfg.estimator} needs samples_per_prompt >= {spec.min_samples_per_prompt} (its baseline is computed "
            f"over a task's samples), got {cfg.samples_per_prompt}: pass --samples-per-prompt "
            f"{spec.min_samples_per_prompt} or use --estimator reinforce_pp",
        )
    return Check(
        "estimator",
        True,
        f"{cfg.estimator}, {cfg.samples_per_prompt} sample{'s' if cfg.samples_per_prompt != 1 else ''} per prompt",
    )


def _check_coach(cfg: TrainConfig) -> Check:
    """The coach the run's reward needs, built as the trainer builds it (an unknown spec fails here, not in the
    run); 'none' and outcome-only estimators need none."""
    if cfg.coach == "none" or not process_reward(cfg):
        return Check("coach", True, f"none ({'coach none' if cfg.coach == 'none' else cfg.estimator}: outcome only)")
    served = served_model(cfg.coach)
    if served is not None:  # the trainer serves it: vLLM and the model must be here
        if importlib.util.find_spec("vllm") is None:
            return Check(
                "coach", False, f"--coach {cfg.coach}: the trainer serves it with vLLM, which is not installed"
            )
        try:
            where = resolve_model(served)
        except Exception as e:
            return Check("coach", False, f"--coach {cfg.coach}: {e}")
        try:
            run_coach(cfg, describe=True)
        except ValueError as e:
            return Check("coach", False, f"--coach {cfg.coach}: {e}")
        return Check("coach", True, f"{cfg.coach} (a vllm serve of {where}, started by the trainer)")
    try:
        coach = run_coach(cfg)
    except Exception as e:  # a spec that names no coach, a factory that fails
        return Check("coach", False, f"--coach {cfg.coach!r}: {e}")
    return Check("coach", True, f"{cfg.coach} ({getattr(coach, 'name', type(coach).__name__)})")


def _check_options(cfg: TrainConfig) -> Check:
    problems = choice_problems(cfg)  # every field typed as a Literal: trainer, truncated, zero_stage, dtype...
    if cfg.train_batch is not None and cfg.train_batch < 1:
        problems.append(f"train_batch must be a number of samples (1 or more), not {cfg.train_batch}")
    if cfg.rollout_is_cap < 0:
        problems.append(f"rollout_is_cap must be 0 (off) or positive, not {cfg.rollout_is_cap}")
    if cfg.rollouts_from:
        try:
            source_config(cfg)
        except (FileNotFoundError, ValueError) as err:
            problems.append(str(err))
    for name in ("micro_batch", "world_size", "iterations", "max_new_tokens", "max_prompt_tokens"):
        if getattr(cfg, name) < 1:
            problems.append(f"{name} must be at least 1, not {getattr(cfg, name)}")
    if problems:
        return Check("options", False, "; ".join(problems))
    return Check(
        "options",
        True,
        f"trainer {cfg.trainer}, advantage_scope {cfg.advantage_scope}, truncated {cfg.truncated}, "
        f"mask_coach_fallbacks {cfg.mask_coach_fallbacks}",
    )


def _check_memory(cfg: TrainConfig, folder: Path | None, n_roles: int | None, held_gib: float = 0.0) -> Check:
    if cfg.trainer not in choices(TrainConfig, "trainer"):
        return Check("memory", True, "not estimated: unknown trainer")
    shape = model_shape(cfg.model, folder)
    if shape is None:
        return Check("memory", True, f"not estimated: the shape of {cfg.model!r} is unknown (no config.json)")
    assumed = n_roles is None
    est = estimate_memory(cfg, shape, n_roles or 3)
    if held_gib > 0 and est.budget is not None and est.target == "host":  # the pool's actors: this run's to take
        held = f"{est.budget_source}, plus {held_gib:.1f} GiB held by the idle actors of the run's pool"
        est = estimate_memory(cfg, shape, n_roles or 3, budget=(est.budget + held_gib, held))
    if assumed:
        est.notes.append("3 roles assumed: the environment could not be built")
    if not est.fits and est.budget is not None:
        found = suggest_settings(cfg, shape, n_roles or 3, est.budget)
        if found is not None:
            est.suggestion, est.suggested_total = found
    if not cfg.memory_check:
        return Check("memory", True, "skipped (memory_check=False / --no-memory-check); " + est.describe(), est)
    cluster = ray_target()
    if cfg.trainer == "ray" and cluster.address is not None:  # RAY_ADDRESS=local is a local cluster: checked
        return Check(
            "memory",
            True,
            f"not checked: {cluster.source} points at a cluster whose memory this machine cannot see; "
            + est.describe(),
            est,
        )
    if est.fits:
        return Check("memory", True, est.describe(), est)
    if est.suggestion is not None:
        fields = ", ".join(f"{k}={v!r}" for k, v in est.suggestion.items())
        verdict = (
            f"; would fit with {as_flags(est.suggestion)} (fields {fields}: estimated {est.suggested_total:.1f} "
            f"GiB), or skip this check with --no-memory-check"
        )
    else:
        verdict = (
            "; neither ZeRO stage 0, gradient checkpointing, micro-batch 1 nor a 1 GiB KV cache per engine bring it "
            "under: it needs a smaller model, shorter contexts or more memory (GPUs, a cluster; --no-memory-check "
            "skips this check)"
        )
    return Check("memory", False, est.summary() + verdict + "\n" + est.breakdown(), est)


def _check_role_weights(cfg: TrainConfig, roles: list[str] | None) -> Check:
    if roles is None:
        return Check("role weights", False, "the task's roles are unknown (its env could not be built)")
    problems = spec_problems(effective_role_weights(cfg, roles), roles, cfg.trainer)
    if problems:
        return Check("role weights", False, "; ".join(problems))
    specs = role_specs(effective_role_weights(cfg, roles), roles, cfg.trainer)
    missing = []
    for role, s in specs.items():  # full@MODEL: the role's own model must be on disk too
        try:
            if s.model:
                locate_model(s.model)
        except FileNotFoundError as e:
            missing.append(f"{role}=full@{s.model}: {e}")
    if missing:
        return Check("role weights", False, "; ".join(missing))
    detail = ", ".join(
        f"{r} {s.kind}{':' + s.of if s.of else ''}{'@' + s.model if s.model else ''}" for r, s in specs.items()
    )
    return Check("role weights", True, detail)


def _check_placement(cfg: TrainConfig, roles: list[str] | None) -> Check:
    """The placement's keys name actors of this task (whether the cluster has the resources is checked when the
    trainer joins it: :func:`baselines.ray_learner.cluster.check_cluster`)."""
    if cfg.trainer != "ray":
        return Check("placement", False, "placement puts the distributed trainer's actors on nodes (trainer='ray')")
    if roles is None:
        return Check("placement", False, "the task's roles are unknown (its env could not be built)")
    problems = placement_key_problems(cfg.placement, roles)
    detail = "; ".join(problems) or ", ".join(f"{k} on {v}" for k, v in cfg.placement.items())
    return Check("placement", not problems, detail)


def check_config(
    cfg: TrainConfig, *, roles: list[str] | None = None, n_tasks: int | None = None, held_gib: float = 0.0
) -> list[Check]:
    """Every pre-flight check of ``cfg`` (see the module docstring). ``roles`` and ``n_tasks``: the training
    environment's, when the caller has built it already (otherwise it is built here); ``held_gib``: memory that idle
    pooled actors hold and the run will take or stop (:mod:`baselines.training.pool`), counted as available. Loads no
    model, starts no Ray, downloads nothing."""
    model, folder = _check_model(cfg)
    tasks, found_roles = _check_tasks(cfg, roles, n_tasks)
    checks = [model, tasks]
    ev = _check_eval(cfg)
    if ev is not None:
        checks.append(ev)
    checks += [_check_estimator(cfg), _check_coach(cfg), _check_options(cfg)]
    if cfg.role_weights or cfg.share_model:
        checks.append(_check_role_weights(cfg, found_roles))
    if cfg.placement:
        checks.append(_check_placement(cfg, found_roles))
    checks.append(_check_memory(cfg, folder, len(found_roles) if found_roles else None, held_gib))
    return checks


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def raise_for_failed(checks: list[Check]) -> None:
    """Raise ``ValueError`` naming every failed check and its reason (nothing when all passed)."""
    bad = failed(checks)
    if bad:
        raise ValueError(
            "the training configuration cannot run here:\n" + "\n".join(f"- {c.name}: {c.detail}" for c in bad)
        )


def format_checks(checks: list[Check]) -> str:
    """One line per check (``ok`` / ``FAIL``, name, detail; further lines of the detail indented below it)."""
    width = max((len(c.name) for c in checks), default=0) + 2
    lines = []
    for c in checks:
        first, *rest = c.detail.splitlines() or [""]
        lines.append(f"{'ok' if c.ok else 'FAIL':<6}{c.name:<{width}}{first}")
        lines += [" " * (6 + width) + line for line in rest]
    return "\n".join(lines)
