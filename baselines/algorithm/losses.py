"""The policy loss both trainers minimise: the PPO clipped surrogate, per token.

:class:`baselines.training.local_trainer.RoleLearner` (one process) and
:class:`baselines.ray_learner.distributed.RoleWorker` (a DeepSpeed rank) both call :func:`ppo_clip_loss`; the advantages
it weighs come from :mod:`baselines.algorithm.advantages`.

torch is imported inside the function: like :mod:`baselines.ray_learner.distributed`, this module imports no heavy
package at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ppo_clip_loss"]


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO clipped surrogate, averaged over response tokens. Shapes ``[B, T]``. ``weights``: per-token
    importance weights (detached) multiplying each token's loss, the average still over the tokens (truncated
    importance sampling, ``TrainConfig.rollout_is_cap``)."""
    import torch

    ratio = torch.exp(logp - old_logp)
    loss_tok = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps))
    if weights is not None:
        loss_tok = loss_tok * weights
    n = mask.sum().clamp(min=1)
    loss = (loss_tok * mask).sum() / n
    clipped = ((ratio - 1).abs() > clip_eps).float()
    return loss, {"clip_frac": float((clipped * mask).sum() / n)}
