"""The update, written once for every trainer: each set of trained weights' optimiser steps on the samples of every
role that trains it, against the :class:`~baselines.algorithm.learner.Learner` protocol
(:mod:`baselines.algorithm.learner`), and the weight sync after it. :meth:`baselines.training.loop.TrainerBase.update`
and :meth:`~baselines.training.loop.TrainerBase.sync` call these with the trainer's learners."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import torch

from baselines.algorithm.advantages import RoleBatch, advantages_by_role
from baselines.algorithm.learner import Done, Learner, LogProbs, Pending, StepStats, UpdateStats
from baselines.algorithm.samples import Sample
from baselines.config import TrainConfig
from baselines.ray_learner.packing import mini_batches


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


def update(
    by_role: dict[str, list[Sample]],
    learner_of: Mapping[str, Learner],
    owner_of: Mapping[str, str],
    stepped: set[str],
    cfg: TrainConfig,
    lr: float,
    parallel: bool = False,
) -> dict[str, dict[str, float]]:
    """Each trained set of weights takes its optimiser steps on the samples of every role that trains it
    (:mod:`baselines.algorithm.learner`); returns each role's figures
    (:class:`~baselines.algorithm.learner.UpdateStats`).

    1. **Passes.** A role's policy log-probs are the engine's, given at sampling, when they cover every sample
       and its weights take one step on them (or the samples are another run's: then the engine's are the
       ratio's old log-probs and a pass gives the policy's); otherwise a forward pass gives them. The reference
       needs a pass once the weights have stepped; before, the policy *is* the reference (KL exactly 0).
    2. **Advantages** over each role's whole batch (or the team's, ``advantage_scope``), with the KL term. A
       batch whose reward is the same for every sample gets advantages 0 (``no_signal``): the KL term alone,
       whitened, would be a unit-scale step on noise (``kl_only_updates`` takes it).
    3. **Steps**: one per mini-batch of ``train_batch`` samples (default: one over everything), none when every
       advantage is 0 (equal rewards, no KL: the gradient is exactly 0, and an Adam step on it would still move
       the weights by its momentum)."""
    stats = {role: UpdateStats() for role in by_role}
    given = {role: samples for role, samples in by_role.items() if samples}
    groups: dict[str, list[str]] = {}
    for role in given:
        groups.setdefault(owner_of[role], []).append(role)
    n_steps = {
        o: len(mini_batches(sum(len(given[r]) for r in rs), cfg.train_batch, cfg.seed)) for o, rs in groups.items()
    }
    engine: dict[str, list[torch.Tensor]] = {}  # roles whose policy log-probs are the engine's
    for role, samples in given.items():
        lps = [engine_logprobs(s, cfg.max_new_tokens) for s in samples]
        if cfg.rollout_logprobs and None not in lps and (n_steps[owner_of[role]] == 1 or cfg.rollouts_from):
            engine[role] = [x for x in lps if x is not None]  # all of them
    passes = {
        role: Passes(policy=role not in engine or bool(cfg.rollouts_from), reference=owner_of[role] in stepped)
        for role in given
    }
    batches = _logprob_batches(given, passes, engine, stats, learner_of, parallel)
    no_signal: set[str] = set()  # roles whose batch's reward is constant: advantages 0 unless kl_only_updates
    scope, kl_only = cfg.advantage_scope, cfg.kl_only_updates
    advantages = advantages_by_role(
        cfg.estimator, batches, scope=scope, beta=cfg.beta_kl, kl_only=kl_only, no_signal=no_signal
    )
    for role, batch in batches.items():
        tokens = sum(len(x) for x in batch.logp)
        s = stats[role]
        s.samples, s.tokens, s.no_signal = len(given[role]), tokens, role in no_signal
        s.kl = float(sum((a - b).sum() for a, b in zip(batch.logp, batch.ref_logp, strict=True))) / max(tokens, 1)
        s.adv_abs_mean = float(sum(a.abs().sum() for a in advantages[role])) / max(tokens, 1)
        if cfg.rollouts_from:  # another run's episodes: without the engine's log-probs, the ratio is this policy's
            s.off_policy_uncorrected = 0 if role in engine else len(given[role])
    submitted: dict[str, list[Pending[StepStats]]] = {}
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
        steps = _submit_steps(learner_of[owner], samples, adv, lr, old, behaviour, cfg)
        stepped.add(owner)
        if not parallel:  # this set of weights' peak memory passes before the next one's step
            steps = [Done(step.result()) for step in steps]
        submitted[owner] = steps
    for owner, steps in submitted.items():
        done = [step.result() for step in steps]
        for m in groups[owner]:
            stats[m].steps, stats[m].skipped = done, False
    return {role: s.as_dict() for role, s in stats.items()}


def _submit_steps(
    learner: Learner,
    samples: list[Sample],
    adv: list[torch.Tensor],
    lr: float,
    old: list[torch.Tensor] | None,
    behaviour: list[torch.Tensor] | None,
    cfg: TrainConfig,
) -> list[Pending[StepStats]]:
    """One step per mini-batch of ``train_batch`` samples (shuffled with the seed; default: one over everything)."""
    steps = []
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
    return steps


def _logprob_batches(
    given: dict[str, list[Sample]],
    passes: dict[str, Passes],
    engine: dict[str, list[torch.Tensor]],
    stats: dict[str, UpdateStats],
    learner_of: Mapping[str, Learner],
    parallel: bool,
) -> dict[str, RoleBatch]:
    """Each role's :class:`RoleBatch`: rewards, outcomes, groups, and the policy's and the reference's
    log-probs from the passes asked for (``passes``) or the engine's (``engine``)."""

    def submit(role: str) -> Pending[LogProbs]:
        p, n = passes[role], len(given[role])
        if not (p.policy or p.reference):
            return Done(LogProbs([None] * n, [None] * n))
        return learner_of[role].logprobs(given[role], policy=p.policy, reference=p.reference)

    pending = {role: submit(role) for role in given} if parallel else {}
    out: dict[str, RoleBatch] = {}
    for role, samples in given.items():
        t0 = time.perf_counter()
        got = (pending[role] if parallel else submit(role)).result()
        logp = got.policy if passes[role].policy else engine[role]
        ref = got.reference if passes[role].reference else logp  # not stepped: the reference is the policy
        s = stats[role]
        s.logprob_s, s.policy_pass, s.reference_pass = time.perf_counter() - t0, *dataclasses.astuple(passes[role])
        rewards, outcomes = [x.reward for x in samples], [x.outcome for x in samples]
        out[role] = RoleBatch(rewards, outcomes, [x.group_id for x in samples], list(logp), list(ref))
    return out


def sync(learner_of: Mapping[str, Learner], parallel: bool = False) -> tuple[float, dict[str, float]]:
    """Load every learner's stepped weights into what generates with them; returns the wall seconds and, without
    ``parallel``, each learner's. Without ``parallel`` one learner after the other: the transient copies of one set
    of weights (the gathered state, the engine's incoming copy) are then alive at a time, not every role's (syncing
    three 135M roles at once pushed the smoke preset on SmolLM2 over Ray's memory limit)."""
    t0 = time.perf_counter()
    by_learner: dict[str, float] = {}
    pending = []
    for name, learner in unique(learner_of):
        t = time.perf_counter()
        job = learner.sync()
        if job is None:
            continue
        if parallel:
            pending.append(job)
        else:
            job.result()
            by_learner[name] = time.perf_counter() - t
    for job in pending:
        job.result()
    return time.perf_counter() - t0, by_learner


def unique(learner_of: Mapping[str, Learner]) -> list[tuple[str, Learner]]:
    """Every learner once, by its owner's name, in name order."""
    return sorted({learner.name: learner for learner in learner_of.values()}.items())


__all__ = ["Passes", "engine_logprobs", "sync", "unique", "update"]
