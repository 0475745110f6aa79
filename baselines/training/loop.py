"""The training loop shared by both trainers: rollouts into an on-disk trajectory store, samples per role, metrics,
logging (JSONL, TensorBoard, optional wandb, a progress bar) and checkpoint bookkeeping with resume.

The update is written once (:func:`baselines.training.update.update`, which :meth:`TrainerBase.update` calls), against
one :class:`~baselines.algorithm.learner.Learner` per set of trained weights; a subclass supplies its learners and the
policies that generate (:class:`baselines.training.ray_trainer.RayTrainer`: DeepSpeed ranks and a vLLM engine per
learner; :class:`baselines.training.local_trainer.LocalTrainer`: torch modules in this process, which also generate).

One iteration of the default (Ray) trainer, in order (file, function; tests/test_iteration_map.py imports every name
listed)::

    baselines/training/loop.py            TrainerBase.train_iteration  the iteration, top to bottom
    baselines/training/loop.py            TrainerBase.rollout          its tasks; stored episodes re-used
    baselines/evaluation/rollout.py       run_episodes                 the envs stepped together, round by round
    baselines/ray_learner/engines.py      VLLMPolicy.submit            a role's waiting conversations to its engine
    mappa_envs/core/pipeline.py           PipelineEnv.step             the action and its tool calls
    mappa_envs/coach/wrapper.py           CoachRewardWrapper.step      the action to the coach; its reward back
    mappa_envs/coach/rule_based.py        RuleBasedCoach.evaluate      the score (the default coach, ``cfg.coach``)
    baselines/algorithm/samples.py        samples_from_episodes        one sample per action, by role
    baselines/algorithm/samples.py        select_trainable             coach fallbacks, truncated replies left out
    baselines/training/update.py          update                       roles grouped by weights; passes; steps
    baselines/training/ray_trainer.py     RayLearner.plan              a learner's samples over its ranks
    baselines/training/ray_trainer.py     RayLearner.logprobs          the passes asked for, on the ranks
    baselines/ray_learner/distributed.py  RoleWorker.logprobs          policy and reference log-probs
    baselines/algorithm/advantages.py     advantages_by_role           the estimator over each role's batch
    baselines/training/ray_trainer.py     RayLearner.step              one optimiser step per mini-batch
    baselines/ray_learner/distributed.py  RoleWorker.train_step        a rank's share of the step
    baselines/algorithm/losses.py         ppo_clip_loss                the loss every learner minimises
    baselines/training/update.py          sync                         every stepped learner to its engine
    baselines/training/ray_trainer.py     RayLearner.sync              rank 0's gathered weights to the engine
    baselines/ray_learner/engines.py      VLLMEngine.load_weights      the engine loads them

The single-process trainer runs the same rows with transformers generation
(:meth:`baselines.weights.policies.TransformersPolicy.generate`) and its learner
(:class:`baselines.training.local_trainer.LocalLearner`, over :class:`baselines.training.local_trainer.RoleLearner`) in
place of the engines, the ranks and the sync. The typed results a learner returns are in
:mod:`baselines.algorithm.learner`.

Layout of ``out_dir``::

    config.json
    rollouts/iter-00003.jsonl    every finished episode of iteration 3, appended (and fsync'd) as it completes
    rescored/iter-00003/         with ``rollouts_from``: the source run's episodes re-scored (baselines.runs.offline)
    checkpoints/iter-00002/      the trainer's state after iteration 2 (+ state.json)
    checkpoints/latest           name of the newest complete checkpoint (written last, atomically)
    metrics.jsonl                one line per iteration
    tensorboard/                 scalars per role

Resume: the run restarts after the latest checkpoint; the stored episodes of the interrupted iteration are read
back and only the missing ones are rolled out (episode ``i`` of an iteration always gets the same task and seed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import mappa_envs
from baselines.algorithm.advantages import estimator_spec, singleton_groups, uses_process_reward
from baselines.algorithm.learner import Learner
from baselines.algorithm.samples import Sample, coach_counts, samples_from_episodes, select_trainable
from baselines.config import TrainConfig, config_record, process_reward, run_coach, served_model
from baselines.evaluation.heldout_eval import evaluate_heldout
from baselines.evaluation.rollout import run_episodes
from baselines.planning.checks import check_config, raise_for_failed
from baselines.ray_learner.cluster import actor_resources
from baselines.ray_learner.coach_engine import CoachEngine
from baselines.runs.offline import stored_rollout
from baselines.runs.run_log import (
    IterationMetrics,
    MetricsLog,
    RoleMetrics,
    episode_outcomes,
    role_metrics,
    update_summary,
)
from baselines.runs.store import TrajectoryStore, check_resumable
from baselines.training.update import sync, unique, update
from baselines.weights.policies import CountsTokens, Policy
from baselines.weights.role_weights import effective_role_weights, owners, role_specs
from mappa_envs.coach import CoachRewardWrapper
from mappa_envs.core import EpisodeRecord
from mappa_envs.metrics import RoleStats, role_stats


class TrainerBase(ABC):
    """The iteration loop; a subclass implements the abstract methods (:meth:`policies`, :meth:`update`,
    :meth:`save_state`, :meth:`load_state`, :meth:`export_models`) and, when its policies generate from a copy of
    the weights, :meth:`sync`."""

    kind: str = ""
    """The ``TrainConfig.trainer`` value this class implements (``"ray"``, ``"local"``)."""

    def __init__(self, cfg: TrainConfig):
        if self.kind and cfg.trainer != self.kind:
            # the class was chosen directly (``LocalTrainer(cfg)``): its checks (the memory estimate differs by
            # trainer) and the saved config.json must describe the trainer that runs, not the field's default
            # (a subclass's kind is one of the field's values)
            cfg = dataclasses.replace(cfg, trainer=self.kind)  # type: ignore[arg-type]
        self.cfg = cfg
        probe = mappa_envs.make(cfg.env_id, **cfg.env_kwargs)
        self.roles = [r.name for r in probe.unwrapped.roles]
        self.n_tasks = len(probe.unwrapped.tasks)
        probe.close()
        # every configuration problem (model on disk, pool size, GRPO's samples, held-out tasks, memory) is refused
        # here, before Ray or a model starts, not after a rollout
        raise_for_failed(check_config(cfg, roles=self.roles, n_tasks=self.n_tasks, held_gib=self.held_gib()))
        self.weights = role_specs(effective_role_weights(cfg, self.roles), self.roles, cfg.trainer)
        """Every role's weights (:mod:`baselines.weights.role_weights`): its own, frozen, or shared with another
        role."""
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = TrajectoryStore(self.out)
        self.metrics_log = MetricsLog(self.out, cfg)
        self.iteration = 0
        """The iteration being trained (its learning rate: ``cfg.lr_at(iteration)``)."""
        self.rollout_timings: dict[str, float] = {}
        """Where the last rollout's time went (:func:`baselines.evaluation.rollout.run_episodes`' ``timings``)."""
        self.sync_by_role: dict[str, float] = {}
        """Seconds of each role's last weight sync into its engine (a trainer without engines: none)."""
        self.on_phase: Any = None
        """Called with one progress line after each phase of an iteration (rollout, update), or None."""
        self.coach_engine: CoachEngine | None = None
        """The coach's server when the trainer serves it (``--coach vllm:MODEL``: :meth:`start_coach`)."""
        self.owner = owners(self.weights)
        """Whose weights each role trains and acts with (a shared role: its owner's; every other role: its own)."""
        self.learner_of: dict[str, Learner] = {}
        """Each trained role's :class:`~baselines.algorithm.learner.Learner` (roles that share weights share it); set by
        the subclass."""
        self.parallel_updates = False
        """Start every learner's passes and steps before waiting on any (the Ray trainer on a GPU); otherwise one
        learner's work finishes before the next one's starts (its peak memory is gone first)."""
        self.sync_seconds: list[float] = []
        self._stepped: set[str] = set()
        """Learners that have taken a step: their policy is no longer the reference (a checkpoint records them)."""

    # ----------------------------------------------------------------- to implement
    @abstractmethod
    def policies(self) -> Mapping[str, Policy]:
        """The policy each role generates with (the rollout's)."""

    def export_frozen(self, role: str, path: Path) -> None:
        """Write a frozen role without a learner (its base model, unchanged) as a transformers folder ``path``."""
        raise NotImplementedError(f"{type(self).__name__} has no learner for {role!r} and cannot export it")

    def eval_policies(self, temperature: float) -> Mapping[str, Policy]:
        """The current policies sampling at ``temperature`` (held-out evaluation)."""
        return self.policies()

    def generated_tokens(self) -> int:
        return sum(p.generated_tokens for p in self.policies().values() if isinstance(p, CountsTokens))

    # ----------------------------------------------------------------- environment and tasks
    def env_fn(self, **overrides: Any):
        cfg = self.cfg
        env = mappa_envs.make(cfg.env_id, **{**cfg.env_kwargs, **overrides})
        if cfg.coach == "none":
            return env

        return CoachRewardWrapper(
            env, run_coach(cfg, self.coach_url)
        )  # 'rule', 'llm:MODEL@URL', or your own 'package.module:factory'

    def held_gib(self) -> float:
        """Memory held by actors this run takes over (a Ray trainer's pool): available to it, for the memory check."""
        return 0.0

    @property
    def coach_url(self) -> str | None:
        """The address of the coach's server when the trainer serves it, else None."""
        return self.coach_engine.url if self.coach_engine is not None else None

    def start_coach(self, ray: Any = None) -> None:
        """Start the coach's server when ``--coach vllm:MODEL`` asks for one: here, or with ``ray`` in an actor
        placed by ``--place coach=RESOURCE`` (:mod:`baselines.ray_learner.coach_engine`); nothing for any other
        coach."""
        model = served_model(self.cfg.coach)
        if model is None or self.coach_engine is not None or not process_reward(self.cfg):
            return  # no served coach, or an outcome-only run, whose reward needs none
        resources = actor_resources(self.cfg.placement, "coach", "coach") if ray is not None else None
        self.coach_engine = CoachEngine(model, self.out, ray=ray, resources=resources)
        print(
            f"[coach: a vllm serve of {model} at {self.coach_url}, up in {self.coach_engine.start_s:.0f}s]", flush=True
        )

    def tasks_for(self, iteration: int) -> np.ndarray:
        """The task indices of an iteration: a function of (seed, iteration) only, so a resumed run draws the same."""
        rng = np.random.default_rng([self.cfg.seed, iteration])
        return rng.choice(self.n_tasks, size=self.cfg.prompts_per_iteration, replace=False)

    def rollout(self, iteration: int) -> tuple[list[EpisodeRecord], int]:
        """All episodes of an iteration, the stored ones re-used; returns (records in order, number re-used)."""
        cfg = self.cfg
        if cfg.rollouts_from:
            return stored_rollout(cfg, iteration, self.store, self.out, self.coach_url), 0
        k = cfg.samples_per_prompt
        n = cfg.prompts_per_iteration * k
        tasks = self.tasks_for(iteration)
        stored = self.store.load(iteration)
        todo = [i for i in range(n) if i not in stored]
        bar = self._progress(total=n, initial=n - len(todo), desc=f"iteration {iteration + 1}/{cfg.iterations}")
        if todo:
            new = run_episodes(
                self.env_fn,
                self.policies(),
                todo,
                seed=cfg.seed + 10_000 * iteration,
                concurrency=cfg.concurrency,
                reset_options=lambda i: {"task_index": int(tasks[i // k])},
                on_episode=lambda i, rec: self._stored(iteration, i, rec, bar),
                timings=self.rollout_timings,
            )
            stored.update(zip(todo, new, strict=True))
        if bar:
            bar.close()
        return [stored[i] for i in range(n)], n - len(todo)

    def _stored(self, iteration: int, i: int, record: EpisodeRecord, bar: Any) -> None:
        """A finished episode on disk (and on the progress bar)."""
        self.store.append(iteration, i, record)
        if bar is not None:
            bar.update(1)

    # ----------------------------------------------------------------- evaluation
    def evaluate(
        self, split: str | None, episodes: int, *, seed: int = 123, samples: int | None = None
    ) -> dict[str, Any]:
        """Held-out episodes with the current policies at ``eval_temperature``, no coach
        (:func:`baselines.evaluation.heldout_eval.evaluate_heldout`)."""
        policies = lambda: self.eval_policies(self.cfg.eval_temperature)  # noqa: E731 - made once the tasks are known
        return evaluate_heldout(self.cfg, policies, split, episodes, seed=seed, samples=samples)

    # ----------------------------------------------------------------- the update
    def update(self, by_role: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        """Each set of weights' optimiser steps on its roles' samples (:func:`baselines.training.update.update`);
        returns each role's figures."""
        lr = self.cfg.lr_at(self.iteration)
        return update(by_role, self.learner_of, self.owner, self._stepped, self.cfg, lr, self.parallel_updates)

    def sync(self) -> float:
        """Every stepped learner's weights into what generates with them (:func:`baselines.training.update.sync`);
        returns the wall seconds."""
        seconds, self.sync_by_role = sync(self.learner_of, self.parallel_updates)
        self.sync_seconds.append(seconds)
        return seconds

    def save_state(self, path: Path) -> None:
        """Every learner's weights and optimiser state, and which of them have stepped (a resumed learner that never
        stepped keeps its exact-zero KL instead of a reference pass whose gap to the engine is numeric noise)."""
        for _, learner in unique(self.learner_of):
            learner.save(path)
        (Path(path) / "stepped_roles.json").write_text(json.dumps(sorted(self._stepped)))

    def load_state(self, path: Path) -> None:
        for _, learner in unique(self.learner_of):
            learner.load(path)
        saved = Path(path) / "stepped_roles.json"
        # a checkpoint from before this file may hold steps of any role: the reference pass is needed for all
        self._stepped.update(json.loads(saved.read_text()) if saved.exists() else self.roles)

    def export_models(self, path: Path) -> None:
        """``path/<role>/`` per role, what ``mappa eval --run`` loads: its weights (a shared role's are its owner's),
        one role at a time (each export holds a gathered copy beside the rank's own: about 1 GB for a 135M model in
        float32, and three at once ran a 24 GB machine out of memory)."""
        for role in self.roles:
            if role in self.learner_of:
                self.learner_of[role].export(path / role)
            else:
                self.export_frozen(role, path / role)

    # ----------------------------------------------------------------- checkpoints
    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        latest = self.ckpt_root / "latest"
        if not latest.exists():
            return None
        path = self.ckpt_root / latest.read_text().strip()
        state = json.loads((path / "state.json").read_text())
        return int(state["iteration"]), path

    def checkpoint(self, iteration: int) -> Path:
        path = self.ckpt_root / f"iter-{iteration:05d}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        self.save_state(path)
        (path / "state.json").write_text(json.dumps({"iteration": iteration, "time": time.time()}))
        tmp = self.ckpt_root / "latest.tmp"
        tmp.write_text(path.name)
        os.replace(tmp, self.ckpt_root / "latest")  # the checkpoint counts only from here on
        done = sorted(p for p in self.ckpt_root.glob("iter-*") if p.is_dir() and p != path)
        for old in done[: max(0, len(done) - (self.cfg.keep_checkpoints - 1))]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def resume(self) -> int:
        """Load the latest checkpoint if any; returns the first iteration still to run."""
        if not self.cfg.resume:  # a fresh run: nothing of an earlier run in out_dir may leak into this one
            for old in (self.ckpt_root, self.store.root):
                shutil.rmtree(old, ignore_errors=True)
            self.store.root.mkdir(parents=True)
            (self.out / "metrics.jsonl").unlink(missing_ok=True)
            return 0
        found = self.latest_checkpoint()
        if found is None:
            self.metrics_log.trim(-1)
            return 0
        iteration, path = found
        self.load_state(path)
        self.sync()
        self.metrics_log.trim(iteration)
        print(f"[resume] from {path} (iteration {iteration + 1} done)", file=sys.stderr, flush=True)
        return iteration + 1

    # ----------------------------------------------------------------- logging
    def _progress(self, **kwargs: Any):
        if not self.cfg.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(unit="episode", file=sys.stderr, dynamic_ncols=True, **kwargs)

    # ----------------------------------------------------------------- the loop
    def train_iteration(self, iteration: int) -> dict[str, Any]:
        """One iteration, top to bottom: roll out, make each role's samples, update, sync, measure."""
        t0 = time.perf_counter()
        gen_before = self.generated_tokens()
        self.rollout_timings = {}
        records, reused = self.rollout(iteration)
        gen_time = time.perf_counter() - t0
        generated = self.generated_tokens() - gen_before
        every = samples_from_episodes(records)
        by_role, masked = self._trainable(every)
        self.iteration = iteration
        self._phase(
            f"rollout {len(records)} episodes in {gen_time:.0f}s ({generated / gen_time if gen_time else 0:.0f} "
            f"generated tok/s, {reused} re-used)"
        )
        t1 = time.perf_counter()
        stats = self.update(by_role)  # frozen roles are not in by_role: never updated, never synced
        stats.update({r: {"skipped": 1, "frozen": 1, "samples": 0} for r in every if self.weights[r].kind == "frozen"})
        train_time = time.perf_counter() - t1
        self._phase(f"update {train_time:.0f}s: " + "; ".join(update_summary(r, stats.get(r, {})) for r in every))
        sync_time = self.sync()
        by_stats = role_stats(records)  # every role's at once
        roles = {
            role: RoleMetrics(
                behaviour=role_metrics(by_stats.get(role, RoleStats(role)), samples),
                coach=coach_counts(samples),
                masked=masked[role],
                update=stats.get(role, {}),
                sync_s=self.sync_by_role.get(role),
            )
            for role, samples in every.items()
        }
        return IterationMetrics(
            iteration=iteration,
            episodes=len(records),
            reused_episodes=reused,
            outcomes=episode_outcomes(records),
            rollout_s=gen_time,
            train_s=train_time,
            sync_s=sync_time,
            iteration_s=time.perf_counter() - t0,
            gen_tok_s=generated / gen_time if generated else 0.0,
            rollouts_from=self.cfg.rollouts_from,
            rollout_breakdown=self._rollout_breakdown(),
            roles=roles,
        ).as_dict()

    def _trainable(self, every: dict[str, list[Sample]]) -> tuple[dict[str, list[Sample]], dict[str, dict[str, int]]]:
        """Per role, the samples that go into the loss and the counts of those masked out (coach fallbacks under a
        process reward, truncated replies with ``truncated="mask"``; GRPO's groups of one)."""
        cfg = self.cfg
        by_role: dict[str, list[Sample]] = {}
        masked: dict[str, dict[str, int]] = {}
        for role, samples in every.items():
            if self.weights[role].kind == "frozen":  # acts, is not trained on
                masked[role] = {}
                continue
            by_role[role], masked[role] = select_trainable(
                samples,
                mask_fallbacks=cfg.mask_coach_fallbacks and uses_process_reward(cfg.estimator),
                mask_truncated=cfg.truncated == "mask",
            )
            if estimator_spec(cfg.estimator).min_samples_per_prompt > 1:  # a group baseline: count groups of one
                masked[role]["grpo_singletons"] = singleton_groups([s.group_id for s in by_role[role]])
        return by_role, masked

    def _rollout_breakdown(self) -> dict[str, float]:
        """Of ``rollout_s``: waiting on generation, stepping the envs (tools, coach hand-off), the mean batch."""
        t = self.rollout_timings
        out = {f"rollout_{k}": v for k, v in t.items() if k in ("generate_s", "env_s")}
        if t.get("rounds"):
            out["rollout_mean_batch"] = t["requests"] / t["rounds"]
        return out

    def _phase(self, text: str) -> None:
        """One progress line of the running iteration (``on_phase``, set by ``mappa train``)."""
        if self.on_phase is not None:
            self.on_phase(f"[iteration {self.iteration + 1}/{self.cfg.iterations}] {text}")

    def train(self, on_iteration=None) -> list[dict[str, Any]]:
        """Run (or resume) the configured iterations; ``on_iteration(metrics)`` is called after each."""
        cfg = self.cfg
        check_resumable(cfg)
        (self.out / "config.json").write_text(json.dumps(config_record(cfg), indent=2))
        self.metrics_log.open()
        start = self.resume()
        history = []
        for it in range(start, cfg.iterations):
            self.iteration = it
            metrics = self.train_iteration(it)
            self.metrics_log.append(metrics)
            last = it == cfg.iterations - 1
            if last or (cfg.checkpoint_every and (it + 1) % cfg.checkpoint_every == 0):
                t = time.perf_counter()
                self.checkpoint(it)
                # the line was written before the checkpoint (a crash in between re-runs the iteration and trims
                # it); its checkpoint time is added to it now
                metrics["checkpoint_s"] = time.perf_counter() - t
                metrics["iteration_s"] += metrics["checkpoint_s"]
                self.metrics_log.amend_last(metrics)
            history.append(metrics)
            if on_iteration is not None:
                on_iteration(metrics)
        if start < cfg.iterations or not (self.out / "models").exists():
            self.export_models(self.out / "models")
        return history

    def close(self) -> None:
        try:
            self.metrics_log.close()
        finally:
            if self.coach_engine is not None:
                engine, self.coach_engine = self.coach_engine, None
                engine.close()
