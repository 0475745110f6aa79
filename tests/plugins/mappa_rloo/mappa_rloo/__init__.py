"""RLOO, REINFORCE with a leave-one-out baseline (Ahmadian et al., 2024, "Back to Basics"), as a plug-in estimator.

Each sample's reward is compared with the mean reward of the *other* samples of its group (one agent's actions in
the samples of one task): ``A_i = R_i - mean_{j != i} R_j``. The KL penalty enters the token rewards as in the
built-in estimators; the returns are not whitened (the leave-one-out baseline already centres them). An action
alone in its group has no baseline and gets 0.
"""

import torch

from baselines.algorithm.advantages import AdvantageBatch, groups_of, register_estimator, returns_to_go, token_rewards


def leave_one_out(rewards: torch.Tensor, group_ids: list[str]) -> torch.Tensor:
    """``R_i - mean_{j != i} R_j`` within each group; 0 for a group of one."""
    out = torch.zeros_like(rewards, dtype=torch.float32)
    for members in groups_of(group_ids).values():
        if len(members) < 2:
            continue
        r = rewards[members].to(torch.float32)
        out[members] = r - (r.sum() - r) / (len(members) - 1)
    return out


def rloo(batch: AdvantageBatch, *, beta: float = 0.01, eps: float = 1e-6) -> torch.Tensor:
    if batch.group_ids is None:
        raise ValueError("rloo needs group ids (samples_per_prompt >= 2)")
    mask = batch.mask.to(torch.float32)
    rewards = token_rewards(leave_one_out(batch.rewards, batch.group_ids), batch, beta)
    return returns_to_go(rewards, mask) * mask


def signal(batch: AdvantageBatch, **_) -> torch.Tensor:
    """The reward each sample carries before the KL term: constant (all 0) when every group's rewards are equal."""
    return leave_one_out(batch.rewards, batch.group_ids)


def register() -> None:
    register_estimator("rloo", rloo, min_samples_per_prompt=2, signal=signal)
