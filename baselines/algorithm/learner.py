"""What the training loop asks of one set of trained weights: the :class:`Learner` protocol and its typed results.

The update (:func:`baselines.training.update.update`) is written once, against this protocol: which roles train
which weights, whether the engine's log-probs stand in for a policy pass, the advantages, the optimiser-step
mini-batches, skipping a step whose advantages are all 0, and the metrics. A learner only runs what it is asked:

- :class:`baselines.training.local_trainer.LocalLearner`: a torch model, its frozen reference and its optimiser in this
  process (:class:`baselines.training.local_trainer.RoleLearner`); generation uses the same modules, so there is nothing
  to sync.
- :class:`baselines.training.ray_trainer.RayLearner`: ``world_size`` DeepSpeed ZeRO-3 ranks
  (:class:`baselines.ray_learner.distributed.RoleWorker`) and the vLLM engine that generates with a copy of their
  weights.

Both calls that do work (:meth:`Learner.logprobs`, :meth:`Learner.step`) return a :class:`Pending`: the Ray learner
submits to its actors and returns at once, so the loop can start every role's work before it waits on any (on a
GPU); the local learner has already finished when it returns (:class:`Done`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from baselines.algorithm.samples import Sample

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """Work submitted to a learner; :meth:`result` waits for it."""

    def result(self) -> T_co: ...


@dataclass(frozen=True)
class Done(Generic[T]):
    """Work that finished when it was submitted."""

    value: T

    def result(self) -> T:
        return self.value


@dataclass
class LogProbs:
    """Per sample, in the order given: its response tokens' log-probs under the policy and under the frozen
    reference; None for a pass that was not asked for."""

    policy: list[torch.Tensor | None]
    reference: list[torch.Tensor | None]


@dataclass
class StepStats:
    """One optimiser step on one mini-batch (over every rank of the learner)."""

    loss: float
    """The PPO-clipped surrogate, averaged over the step's response tokens."""
    clip_frac: float
    grad_norm: float
    """Before clipping (rank 0's: ZeRO-3 reduces it over the ranks)."""
    lr: float
    """The rate the optimiser stepped at."""
    seconds: float
    """Wall time of the step (the slowest rank)."""
    forward_backward_s: float
    optimizer_s: float
    rank_tokens: list[int]
    """Response tokens each rank trained on (one entry for a learner without ranks)."""
    rollout_logp_gap: float | None = None
    """Mean |log-prob| gap between the engine's (at sampling) and this step's forward, when the engine's were given."""
    is_weight_mean: float | None = None
    """Mean truncated importance weight ``min(pi_trainer / pi_engine, cap)`` with ``rollout_is_cap``."""

    @property
    def tokens(self) -> int:
        return sum(self.rank_tokens)


@dataclass
class UpdateStats:
    """One role's update in an iteration, as ``metrics.jsonl`` stores it under the role (:meth:`as_dict`)."""

    samples: int = 0
    tokens: int = 0
    skipped: bool = True
    """No optimiser step: no samples, a frozen role, or every advantage 0 (the gradient is exactly 0)."""
    frozen: bool = False
    no_signal: bool = False
    """The batch's reward was the same for every sample (``constant_signal``): no step on the KL term alone,
    unless ``kl_only_updates``."""
    kl: float | None = None
    """Mean per-token log-ratio of the policy to the reference over the role's samples, before the step."""
    adv_abs_mean: float | None = None
    logprob_s: float | None = None
    policy_pass: bool | None = None
    """Whether a forward pass gave the policy's log-probs (False: the engine's, from sampling, stood in)."""
    reference_pass: bool | None = None
    """Whether a forward pass gave the reference's (False: the policy has not stepped, it *is* the reference)."""
    off_policy_uncorrected: int | None = None
    """With ``rollouts_from``: samples whose ratio is not against the policy that sampled them."""
    steps: list[StepStats] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        """The flat figures ``metrics.jsonl`` has always held (the keys of stored runs read the same)."""
        out: dict[str, Any] = {"skipped": int(self.skipped), "samples": self.samples, "tokens": self.tokens}
        if self.frozen:
            out["frozen"] = 1
        if self.samples:
            out["no_signal"] = int(self.no_signal)
        for key in ("kl", "adv_abs_mean", "logprob_s", "off_policy_uncorrected"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for key in ("policy_pass", "reference_pass"):
            if getattr(self, key) is not None:
                out[key] = int(getattr(self, key))
        if self.kl is not None and self.skipped:  # a role with samples whose step was skipped (advantages all 0)
            out.update(loss=0.0, clip_frac=0.0, grad_norm=0.0)
        if self.steps:
            out.update(_step_figures(self.steps))
        return out


def _step_figures(steps: list[StepStats]) -> dict[str, float]:
    """A role's figures over its steps: token-weighted loss and clip fraction, mean gradient norm, the last rate,
    summed times, and the ranks' balance over the iteration."""
    n = sum(s.tokens for s in steps)
    secs = sum(s.seconds for s in steps)
    per_rank = [sum(r) for r in zip(*(s.rank_tokens for s in steps), strict=True)]
    gaps = [s.rollout_logp_gap for s in steps if s.rollout_logp_gap is not None]
    out: dict[str, float] = {
        "loss": sum(s.loss * s.tokens for s in steps) / max(n, 1),
        "clip_frac": sum(s.clip_frac * s.tokens for s in steps) / max(n, 1),
        "grad_norm": sum(s.grad_norm for s in steps) / len(steps),
        "lr": steps[-1].lr,
        "optimizer_steps": len(steps),
        "rank_tokens_max": max(per_rank),
        "rank_tokens_min": min(per_rank),
        "train_tok_s": n / secs if secs else 0.0,
        "train_step_s": secs,
        "forward_backward_s": sum(s.forward_backward_s for s in steps),
        "optimizer_s": sum(s.optimizer_s for s in steps),
    }
    if gaps:
        out["rollout_logp_gap"] = sum(gaps) / len(gaps)
    if steps[-1].is_weight_mean is not None:
        out["is_weight_mean"] = steps[-1].is_weight_mean
    return out


class Learner(Protocol):
    """One set of trained weights (a role's, or the owner's of the roles that share them)."""

    name: str
    """The role that owns the weights (a shared role's learner is its owner's)."""

    def logprobs(self, samples: list[Sample], *, policy: bool, reference: bool) -> Pending[LogProbs]:
        """The samples' response log-probs under the current weights and under the frozen reference, at the
        sampling temperature (no gradient)."""
        ...

    def step(
        self,
        samples: list[Sample],
        advantages: list[torch.Tensor],
        lr: float,
        *,
        old_logp: list[torch.Tensor] | None = None,
        behaviour_logp: list[torch.Tensor] | None = None,
    ) -> Pending[StepStats]:
        """One optimiser step on ``samples`` (one mini-batch) with the PPO-clipped loss at rate ``lr``.

        ``old_logp``: the ratio's old log-probs; None when this is the only step on samples the current weights
        sampled (the step's own forward, detached: ratio 1). ``behaviour_logp``: the engine's log-probs at sampling,
        compared with the step's forward (and the importance weights of ``rollout_is_cap``)."""
        ...

    def sync(self) -> Pending[None] | None:
        """Load the weights stepped since the last sync into whatever generates with them; None when generation
        reads the learner's own weights (nothing to copy)."""
        ...

    def save(self, path: Path) -> None:
        """Weights and optimiser state into the checkpoint folder ``path``."""
        ...

    def load(self, path: Path) -> None:
        """Read back what :meth:`save` wrote into ``path``."""
        ...

    def export(self, path: Path) -> None:
        """The current weights as a transformers folder ``path`` (with the tokenizer)."""
        ...


__all__ = ["Done", "Learner", "LogProbs", "Pending", "StepStats", "UpdateStats"]
