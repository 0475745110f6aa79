"""Advantage estimators: pure functions in one table (:data:`ESTIMATORS`); adding one touches one place.

Shapes: ``B`` samples (one per action), ``T`` token positions; ``mask`` marks each sample's response tokens (a
contiguous span anywhere in the row: right-padded responses, or responses after their prompt). Every estimator
takes an :class:`AdvantageBatch` and keyword options and returns advantages of shape ``[B, T]``, zero where
``mask`` is 0.

=================  ==========================================================================================
``reinforce_pp``   REINFORCE++ (the method's main baseline): token reward ``r_t = -beta * KL_t`` with the k1
                   estimate ``KL_t = logp_t - ref_logp_t``, plus the sample's reward (the coach's score / 10) on
                   its last response token; undiscounted return-to-go ``G_t = sum_{u >= t} r_u``; advantages are
                   the returns normalised by the mean and standard deviation over every valid token of the batch
                   (the global batch of one role, or of all roles if the caller batches them together).
``outcome``        the same estimator with the episode's outcome (success / metric) as the sample's reward
                   instead of the coach's score: the outcome-only baseline.
``grpo``           GRPO: ``A_i = (R_i - mean_g R) / (std_g R + eps)`` over the group ``g`` of samples of the same
                   prompt, the same for every token of the sample. Groups of one sample have no baseline: they are
                   refused with a reason, never silently zeroed.
=================  ==========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class AdvantageBatch:
    """The per-sample inputs of the estimators."""

    rewards: torch.Tensor
    """[B] process reward of each sample (coach score / 10)."""
    outcomes: torch.Tensor
    """[B] episode outcome of each sample's episode (1/0 success, or a quality in [0, 1])."""
    mask: torch.Tensor
    """[B, T] 1 for response tokens, 0 for padding."""
    logp: torch.Tensor | None = None
    """[B, T] log-probabilities of the response tokens under the policy that generated them."""
    ref_logp: torch.Tensor | None = None
    """[B, T] the same under the frozen reference model."""
    group_ids: list[str] | None = None
    """[B] prompt-group id of each sample (GRPO)."""


def _masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries, in float64: with (near) constant returns float32
    rounding alone would leave a std of ~1e-8 that, divided into, turns into advantages of order 1."""
    x64, m64 = x.double(), mask.double()
    n = m64.sum().clamp(min=1)
    mean = (x64 * m64).sum() / n
    var = (((x64 - mean) * m64) ** 2).sum() / n
    return ((x64 - mean) / (var.sqrt() + eps) * m64).to(x.dtype)


def token_rewards(sample_rewards: torch.Tensor, batch: AdvantageBatch, beta: float) -> torch.Tensor:
    """``-beta * KL_t`` on every response token plus the sample reward on its last token: ``[B, T]``."""
    mask = batch.mask.to(torch.float32)
    r = torch.zeros_like(mask)
    if beta:
        if batch.logp is None or batch.ref_logp is None:
            raise ValueError("a KL penalty (beta > 0) needs logp and ref_logp")
        r = r - beta * (batch.logp - batch.ref_logp) * mask
    if (mask.sum(dim=1) == 0).any():
        raise ValueError("a sample has no response token: it cannot carry a reward")
    positions = torch.arange(mask.shape[1], dtype=torch.float32)
    last = (mask * (positions + 1)).argmax(dim=1)  # the last response token, wherever the response sits
    rows = torch.arange(mask.shape[0])
    r[rows, last] += sample_rewards.to(torch.float32)
    return r


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{u >= t} r_u`` (gamma = 1) within each sample: a reversed cumulative sum, ``[B, T]``."""
    return torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1]) * mask


def reinforce_pp(batch: AdvantageBatch, *, beta: float = 0.01, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with the process (coach) reward. See the module docstring."""
    mask = batch.mask.to(torch.float32)
    returns = returns_to_go(token_rewards(batch.rewards, batch, beta), mask)
    return _masked_whiten(returns, mask, eps)


def outcome(batch: AdvantageBatch, *, beta: float = 0.01, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with the episode outcome as the only (terminal) reward."""
    mask = batch.mask.to(torch.float32)
    returns = returns_to_go(token_rewards(batch.outcomes, batch, beta), mask)
    return _masked_whiten(returns, mask, eps)


def grpo(batch: AdvantageBatch, *, eps: float = 1e-6, use_outcome: bool = False, **_: object) -> torch.Tensor:
    """Group-normalised sample reward, broadcast to the sample's tokens. See the module docstring."""
    if batch.group_ids is None:
        raise ValueError("GRPO needs group_ids: which samples share a prompt")
    rewards = (batch.outcomes if use_outcome else batch.rewards).to(torch.float32)
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(batch.group_ids):
        groups.setdefault(g, []).append(i)
    singles = [g for g, idx in groups.items() if len(idx) < 2]
    if singles:
        raise ValueError(
            f"GRPO needs at least 2 samples per prompt; {len(singles)} group(s) have 1 (e.g. {singles[0]!r}). "
            "With one sample its advantage would be 0 and nothing would be learned: raise samples_per_prompt, "
            "or use reinforce_pp, whose global-batch baseline works with one sample per prompt."
        )
    adv = torch.zeros_like(rewards)
    for idx in groups.values():
        r = rewards[idx]
        adv[idx] = (r - r.mean()) / (r.std(unbiased=False) + eps)
    return adv[:, None] * batch.mask.to(torch.float32)


Estimator = Callable[..., torch.Tensor]
ESTIMATORS: dict[str, Estimator] = {"reinforce_pp": reinforce_pp, "grpo": grpo, "outcome": outcome}


def compute_advantages(name: str, batch: AdvantageBatch, **options: object) -> torch.Tensor:
    try:
        fn = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}") from None
    return fn(batch, **options)
