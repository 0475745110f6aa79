"""The training loop shared by both trainers: rollouts into an on-disk trajectory store, samples per role, metrics,
logging (JSONL, TensorBoard, optional wandb, a progress bar) and checkpoint bookkeeping with resume.

The update is written once, here (:meth:`TrainerBase.update`), against one :class:`~baselines.learner.Learner` per
set of trained weights; a subclass supplies its learners and the policies that generate
(:class:`baselines.ray_trainer.RayTrainer`: DeepSpeed ranks and a vLLM engine per learner;
:class:`baselines.local_trainer.LocalTrainer`: torch modules in this process, which also generate).

One iteration of the default (Ray) trainer, in order (file, function; tests/test_iteration_map.py imports every name
listed)::

    baselines/loop.py               TrainerBase.train_iteration  the iteration, top to bottom
    baselines/loop.py               TrainerBase.rollout          its tasks; stored episodes re-used
    baselines/rollout.py            run_episodes                 the envs stepped together, round by round
    baselines/engines.py            VLLMPolicy.submit            a role's waiting conversations to its engine
    mappa_envs/core/pipeline.py     PipelineEnv.step             the action and its tool calls
    mappa_envs/coach/wrapper.py     CoachRewardWrapper.step      the action to the coach; its reward back
    mappa_envs/coach/rule_based.py  RuleBasedCoach.evaluate      the score (the default coach, ``cfg.coach``)
    baselines/store.py              TrajectoryStore.append       each finished episode, on disk
    baselines/samples.py            samples_from_episodes        one sample per action, by role
    baselines/samples.py            select_trainable             coach fallbacks, truncated replies left out
    baselines/loop.py               TrainerBase.update           roles grouped by weights; which passes; the steps
    baselines/ray_trainer.py        RayLearner.plan              a learner's samples over its ranks
    baselines/ray_trainer.py        RayLearner.logprobs          the passes asked for, on the ranks
    baselines/distributed.py        RoleWorker.logprobs          policy and reference log-probs
    baselines/advantages.py         advantages_by_role           the estimator over each role's batch
    baselines/ray_trainer.py        RayLearner.step              one optimiser step per mini-batch
    baselines/distributed.py        RoleWorker.train_step        a rank's share of the step
    baselines/losses.py             ppo_clip_loss                the loss every learner minimises
    baselines/loop.py               TrainerBase.sync             every stepped learner to its engine
    baselines/ray_trainer.py        RayLearner.sync              rank 0's gathered weights to the engine
    baselines/engines.py            VLLMEngine.load_weights      the engine loads them

The single-process trainer runs the same rows with transformers generation
(:meth:`baselines.policies.TransformersPolicy.generate`) and its learner
(:class:`baselines.local_trainer.LocalLearner`, over :class:`baselines.local_trainer.RoleLearner`) in place of the
engines, the ranks and the sync. The typed results a learner returns are in :mod:`baselines.learner`.

Layout of ``out_dir``::

    config.json
    rollouts/iter-00003.jsonl    every finished episode of iteration 3, appended (and fsync'd) as it completes
    rescored/iter-00003/         with ``rollouts_from``: the source run's episodes re-scored (``baselines.offline``)
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
import torch

import mappa_envs
from mappa_envs.core import EpisodeRecord
from mappa_envs.metrics import RoleStats, role_stats

from .advantages import RoleBatch, advantages_by_role, estimator_spec, singleton_groups, uses_process_reward
from .checks import check_config, raise_for_failed
from .cluster import actor_resources
from .coach_engine import CoachEngine, served_model
from .config import TrainConfig, config_record, process_reward, run_coach
from .heldout_eval import evaluate_heldout
from .learner import Done, Learner, LogProbs, Pending, UpdateStats
from .offline import stored_rollout
from .packing import mini_batches
from .policies import CountsTokens, Policy
from .role_weights import effective_role_weights, owners, role_specs
from .rollout import run_episodes
from .run_log import MetricsLog
from .samples import Sample, coach_counts, samples_from_episodes, select_trainable
from .store import TrajectoryStore, check_resumable


def role_metrics(stats: RoleStats, samples: list[Sample]) -> dict[str, float]:
    """Behaviour of one role over an iteration's episodes (the paper's statistics): its :func:`mappa_envs.metrics.
    role_stats` entry, as evaluations count them, and its samples' scores."""
    scores = [float(s.coach.score) for s in samples if s.coach] or [s.reward * 10 for s in samples]
    return {
        "mean_coach_score": float(np.mean(scores)) if scores else 0.0,
        # 0 with several samples: every advantage of the role is 0 (REINFORCE++'s normalisation), it does not learn
        "coach_score_std": float(np.std(scores)) if scores else 0.0,
        "mean_reward": float(np.mean([s.reward for s in samples])) if samples else 0.0,
        "tool_call_rate": stats.tool_call_rate,
        "tool_success_rate": stats.tool_success_rate,
        "response_chars": float(np.mean([len(s.response) for s in samples])) if samples else 0.0,
    }


def episode_outcomes(records: list[EpisodeRecord]) -> dict[str, float]:
    """The iteration's share of successful episodes (``accuracy``) and, for a scored task, its mean quality."""
    out = {"accuracy": float(np.mean([r.success for r in records])) if records else 0.0}
    quality = [r.quality for r in records if r.quality is not None]
    if quality:
        out["mean_quality"] = float(np.mean(quality))
    return out


@dataclasses.dataclass(frozen=True)
class Passes:
    """The forward passes a role's samples need before its step."""

    policy: bool
    """The policy's log-probs (False: the engine's, from sampling, stand in)."""
    reference: bool
    """The reference's (False: the weights have not stepped, the policy's are the reference's)."""


def engine_logprobs(s: Sample, max_new_tokens: int) -> torch.Tensor | None:
    """The engine's log-probs of a sample's response tokens, when they cover exactly the tokens trained on."""
    lp = s.response_logprobs
    if lp is None or s.response_ids is None or len(lp) != len(s.response_ids):
        return None
    if len(lp) > max_new_tokens + 1:  # tokenize_samples keeps at most max_new_tokens + 1
        return None
    return torch.tensor(lp, dtype=torch.float32)


def _update_summary(role: str, m: dict[str, Any]) -> str:
    """``role 41s (ref 9s, fwd+bwd 29s, opt 3s, 180 tok/s)``, or why it took no step."""
    if m.get("skipped"):
        why = "frozen" if m.get("frozen") else "no samples" if not m.get("samples") else "all advantages 0"
        return f"{role} skipped ({why})"
    parts = [f"ref {m['logprob_s']:.0f}s" if m.get("reference_pass") or m.get("policy_pass") else "no pass"]
    if "forward_backward_s" in m:
        parts += [f"fwd+bwd {m['forward_backward_s']:.0f}s", f"opt {m['optimizer_s']:.0f}s"]
    total = m.get("logprob_s", 0.0) + m.get("train_step_s", 0.0)
    return f"{role} {total:.0f}s ({', '.join(parts)})"


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
        raise_for_failed(check_config(cfg, roles=self.roles, n_tasks=self.n_tasks))
        self.weights = role_specs(effective_role_weights(cfg, self.roles), self.roles, cfg.trainer)
        """Every role's weights (:mod:`baselines.role_weights`): its own, frozen, or shared with another role."""
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = TrajectoryStore(self.out)
        self.metrics_log = MetricsLog(self.out, cfg)
        self.iteration = 0
        """The iteration being trained (its learning rate: ``cfg.lr_at(iteration)``)."""
        self.rollout_timings: dict[str, float] = {}
        """Where the last rollout's time went (:func:`baselines.rollout.run_episodes`' ``timings``)."""
        self.sync_by_role: dict[str, float] = {}
        """Seconds of each role's last weight sync into its engine (a trainer without engines: none)."""
        self.on_phase: Any = None
        """Called with one progress line after each phase of an iteration (rollout, update), or None."""
        self.coach_engine: CoachEngine | None = None
        """The coach's server when the trainer serves it (``--coach vllm:MODEL``: :meth:`start_coach`)."""
        self.owner = owners(self.weights)
        """Whose weights each role trains and acts with (a shared role: its owner's; every other role: its own)."""
        self.learner_of: dict[str, Learner] = {}
        """Each trained role's :class:`~baselines.learner.Learner` (roles that share weights share it); set by the
        subclass."""
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
        from mappa_envs.coach import CoachRewardWrapper

        return CoachRewardWrapper(
            env, run_coach(cfg, self.coach_url)
        )  # 'rule', 'llm:MODEL@URL', or your own 'package.module:factory'

    @property
    def coach_url(self) -> str | None:
        """The address of the coach's server when the trainer serves it, else None."""
        return self.coach_engine.url if self.coach_engine is not None else None

    def start_coach(self, ray: Any = None) -> None:
        """Start the coach's server when ``--coach vllm:MODEL`` asks for one: here, or with ``ray`` in an actor
        placed by ``--place coach=RESOURCE`` (:mod:`baselines.coach_engine`); nothing for any other coach."""
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
        (:func:`baselines.heldout_eval.evaluate_heldout`)."""
        policies = lambda: self.eval_policies(self.cfg.eval_temperature)  # noqa: E731 - made once the tasks are known
        return evaluate_heldout(self.cfg, policies, split, episodes, seed=seed, samples=samples)

    # ----------------------------------------------------------------- the update
    def update(self, by_role: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        """Each trained set of weights takes its optimiser steps on the samples of every role that trains it
        (:mod:`baselines.learner`); returns each role's figures (:class:`~baselines.learner.UpdateStats`).

        1. **Passes.** A role's policy log-probs are the engine's, given at sampling, when they cover every sample
           and its weights take one step on them (or the samples are another run's: then the engine's are the
           ratio's old log-probs and a pass gives the policy's); otherwise a forward pass gives them. The reference
           needs a pass once the weights have stepped; before, the policy *is* the reference (KL exactly 0).
        2. **Advantages** over each role's whole batch (or the team's, ``advantage_scope``), with the KL term.
        3. **Steps**: one per mini-batch of ``train_batch`` samples (default: one over everything), none when every
           advantage is 0 (equal rewards, no KL: the gradient is exactly 0, and an Adam step on it would still move
           the weights by its momentum)."""
        cfg = self.cfg
        stats = {role: UpdateStats() for role in by_role}
        given = {role: samples for role, samples in by_role.items() if samples}
        groups: dict[str, list[str]] = {}
        for role in given:
            groups.setdefault(self.owner[role], []).append(role)
        n_steps = {
            o: len(mini_batches(sum(len(given[r]) for r in rs), cfg.train_batch, cfg.seed)) for o, rs in groups.items()
        }
        engine: dict[str, list[torch.Tensor]] = {}  # roles whose policy log-probs are the engine's
        for role, samples in given.items():
            lps = [engine_logprobs(s, cfg.max_new_tokens) for s in samples]
            if cfg.rollout_logprobs and None not in lps and (n_steps[self.owner[role]] == 1 or cfg.rollouts_from):
                engine[role] = [x for x in lps if x is not None]  # all of them
        passes = {
            role: Passes(
                policy=role not in engine or bool(cfg.rollouts_from), reference=self.owner[role] in self._stepped
            )
            for role in given
        }
        batches = self._logprob_batches(given, passes, engine, stats)
        advantages = advantages_by_role(cfg.estimator, batches, scope=cfg.advantage_scope, beta=cfg.beta_kl)
        for role, batch in batches.items():
            tokens = sum(len(x) for x in batch.logp)
            s = stats[role]
            s.samples, s.tokens = len(given[role]), tokens
            s.kl = float(sum((a - b).sum() for a, b in zip(batch.logp, batch.ref_logp, strict=True))) / max(tokens, 1)
            s.adv_abs_mean = float(sum(a.abs().sum() for a in advantages[role])) / max(tokens, 1)
            if cfg.rollouts_from:  # another run's episodes: without the engine's log-probs, the ratio is this policy's
                s.off_policy_uncorrected = 0 if role in engine else len(given[role])
        lr = cfg.lr_at(self.iteration)
        submitted: dict[str, list[Pending[Any]]] = {}
        for owner, members in groups.items():  # one set of weights, on the samples of every role that trains them
            adv = [a for m in members for a in advantages[m]]
            if max(float(a.abs().max()) for a in adv) < 1e-8:
                continue
            samples = [s for m in members for s in given[m]]
            logp = [x for m in members for x in batches[m].logp]
            sampled = [x for m in members for x in engine[m]] if all(m in engine for m in members) else None
            if cfg.rollouts_from:  # the policy that sampled them: the engine's log-probs, else uncorrected
                old, behaviour = sampled or logp, None
            elif n_steps[owner] == 1:  # the weights that sampled them: the step's own forward gives the old log-probs
                old, behaviour = None, sampled
            else:  # several steps: the ratio of each against the weights before the first
                old, behaviour = logp, None
            learner = self.learner_of[owner]
            steps: list[Pending[Any]] = []
            for idx in mini_batches(len(samples), cfg.train_batch, cfg.seed):
                steps.append(
                    learner.step(
                        [samples[i] for i in idx],
                        [adv[i] for i in idx],
                        lr,
                        old_logp=None if old is None else [old[i] for i in idx],
                        behaviour_logp=None if behaviour is None else [behaviour[i] for i in idx],
                    )
                )
            self._stepped.add(owner)
            if not self.parallel_updates:  # this set of weights' peak memory passes before the next one's step
                steps = [Done(step.result()) for step in steps]
            submitted[owner] = steps
        for owner, steps in submitted.items():
            done = [step.result() for step in steps]
            for m in groups[owner]:
                stats[m].steps, stats[m].skipped = done, False
        return {role: s.as_dict() for role, s in stats.items()}

    def _logprob_batches(
        self,
        given: dict[str, list[Sample]],
        passes: dict[str, Passes],
        engine: dict[str, list[torch.Tensor]],
        stats: dict[str, UpdateStats],
    ) -> dict[str, RoleBatch]:
        """Each role's :class:`RoleBatch`: rewards, outcomes, groups, and the policy's and the reference's
        log-probs from the passes asked for (``passes``) or the engine's (``engine``)."""

        def submit(role: str) -> Pending[LogProbs]:
            p, n = passes[role], len(given[role])
            if not (p.policy or p.reference):
                return Done(LogProbs([None] * n, [None] * n))
            return self.learner_of[role].logprobs(given[role], policy=p.policy, reference=p.reference)

        pending = {role: submit(role) for role in given} if self.parallel_updates else {}
        out: dict[str, RoleBatch] = {}
        for role, samples in given.items():
            t0 = time.perf_counter()
            got = (pending[role] if self.parallel_updates else submit(role)).result()
            logp = got.policy if passes[role].policy else engine[role]
            ref = got.reference if passes[role].reference else logp  # not stepped: the reference is the policy
            s = stats[role]
            s.logprob_s, s.policy_pass, s.reference_pass = time.perf_counter() - t0, *dataclasses.astuple(passes[role])
            rewards, outcomes = [x.reward for x in samples], [x.outcome for x in samples]
            out[role] = RoleBatch(rewards, outcomes, [x.group_id for x in samples], list(logp), list(ref))
        return out

    def sync(self) -> float:
        """Load every learner's stepped weights into what generates with them; returns the wall seconds. Without
        ``parallel_updates`` one learner after the other: the transient copies of one set of weights (the gathered
        state, the engine's incoming copy) are then alive at a time, not every role's (syncing three 135M roles at
        once pushed the smoke preset on SmolLM2 over Ray's memory limit)."""
        t0 = time.perf_counter()
        self.sync_by_role = {}
        pending = []
        for name, learner in self._learners():
            t = time.perf_counter()
            job = learner.sync()
            if job is None:
                continue
            if self.parallel_updates:
                pending.append(job)
            else:
                job.result()
                self.sync_by_role[name] = time.perf_counter() - t
        for job in pending:
            job.result()
        seconds = time.perf_counter() - t0
        self.sync_seconds.append(seconds)
        return seconds

    def _learners(self) -> list[tuple[str, Learner]]:
        """Every learner once, by its owner's name."""
        return sorted({learner.name: learner for learner in self.learner_of.values()}.items())

    def save_state(self, path: Path) -> None:
        """Every learner's weights and optimiser state, and which of them have stepped (a resumed learner that never
        stepped keeps its exact-zero KL instead of a reference pass whose gap to the engine is numeric noise)."""
        for _, learner in self._learners():
            learner.save(path)
        (Path(path) / "stepped_roles.json").write_text(json.dumps(sorted(self._stepped)))

    def load_state(self, path: Path) -> None:
        for _, learner in self._learners():
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
        self._phase(f"update {train_time:.0f}s: " + "; ".join(_update_summary(r, stats.get(r, {})) for r in every))
        sync_time = self.sync()
        metrics: dict[str, Any] = {
            "iteration": iteration,
            "episodes": len(records),
            "reused_episodes": reused,
            **episode_outcomes(records),
            "rollout_s": gen_time,
            "train_s": train_time,
            "sync_s": sync_time,
            "iteration_s": time.perf_counter() - t0,
            "gen_tok_s": generated / gen_time if generated else 0.0,
            **({"rollouts_from": self.cfg.rollouts_from} if self.cfg.rollouts_from else {}),
            **self._rollout_breakdown(),
        }
        by_stats = role_stats(records)  # every role's at once
        for role, samples in every.items():
            metrics[role] = {
                **role_metrics(by_stats.get(role, RoleStats(role)), samples),
                **coach_counts(samples),
                **masked[role],
                **stats.get(role, {}),
                **({"sync_s": self.sync_by_role[role]} if role in self.sync_by_role else {}),
            }
        return metrics

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
