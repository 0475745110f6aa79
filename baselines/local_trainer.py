"""A single-process trainer for small models with plain transformers: REINFORCE++, GRPO or outcome-only.

For debugging and machines without Ray. It shares the estimators (:mod:`baselines.advantages`) and the sample code
(:mod:`baselines.samples`) with the distributed trainer. One iteration:

1. roll out ``prompts_per_iteration x samples_per_prompt`` episodes with the current policies (generation batched
   per role), the coach scoring every action concurrently;
2. turn every action into a sample of its role (prompt = the agent's full context at that turn);
3. per role: log-probs under the generating policy and the frozen reference, advantages from the chosen estimator,
   one pass of the PPO-style clipped loss (epsilon 0.2) in micro-batches with gradient accumulation, gradient
   clipping, an AdamW step.

Each role has its own weights, reference and optimiser (``share_model=True`` shares one model across roles).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from .advantages import AdvantageBatch, compute_advantages
from .config import TrainConfig
from .loop import TrainerBase
from .policies import GenerationConfig, TransformersPolicy
from .samples import Sample, token_logprobs, tokenize_samples

__all__ = ["LocalTrainer", "RoleLearner", "TrainConfig", "ppo_clip_loss"]


def ppo_clip_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO clipped surrogate, averaged over response tokens. Shapes ``[B, T]``."""
    ratio = torch.exp(logp - old_logp)
    loss_tok = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps))
    n = mask.sum().clamp(min=1)
    loss = (loss_tok * mask).sum() / n
    clipped = ((ratio - 1).abs() > clip_eps).float()
    return loss, {"clip_frac": float((clipped * mask).sum() / n)}


class RoleLearner:
    """One role's trainable model, frozen reference and optimiser."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, cfg: TrainConfig):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.ref = copy.deepcopy(model).eval()
        for p in self.ref.parameters():
            p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas)

    def update(self, samples: list[Sample]) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        batches = [
            tokenize_samples(
                samples[i : i + cfg.micro_batch], self.tokenizer, cfg.max_prompt_tokens, cfg.max_new_tokens + 1
            )
            for i in range(0, len(samples), cfg.micro_batch)
        ]
        # One update per batch of fresh rollouts: the generating policy *is* the current model, so the old
        # log-probs are the current ones (detached in the loss pass below; one forward pass saved). They are
        # computed here too when the KL needs them, together with the reference's.
        with torch.no_grad():
            self.model.eval()
            olds = [token_logprobs(self.model, b) for b in batches] if cfg.beta_kl else None
            refs = [token_logprobs(self.ref, b) for b in batches] if cfg.beta_kl else None
        # advantages over the role's whole batch (global normalisation), then split back into micro-batches
        width = max(b.response_mask.shape[1] for b in batches)

        def pad(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, width - x.shape[1]))

        mask = torch.cat([pad(b.response_mask) for b in batches])
        adv = compute_advantages(
            cfg.estimator,
            AdvantageBatch(
                rewards=torch.tensor([s.reward for s in samples]),
                outcomes=torch.tensor([s.outcome for s in samples]),
                mask=mask,
                logp=torch.cat([pad(o) for o in olds]) if olds else None,
                ref_logp=torch.cat([pad(r) for r in refs]) if refs else None,
                group_ids=[s.group_id for s in samples],
            ),
            **({} if cfg.estimator == "grpo" else {"beta": cfg.beta_kl}),
        )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = float(mask.sum())
        stats = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0}
        row = 0
        for i, b in enumerate(batches):
            n = b.input_ids.shape[0]
            a = adv[row : row + n, : b.response_mask.shape[1]]
            row += n
            logp = token_logprobs(self.model, b)
            old = logp.detach()
            loss, info = ppo_clip_loss(logp, old, a, b.response_mask, cfg.clip_eps)
            weight = float(b.response_mask.sum()) / max(total, 1.0)
            (loss * weight).backward()
            stats["loss"] += float(loss.detach()) * weight
            stats["clip_frac"] += info["clip_frac"] * weight
            if refs is not None:
                stats["kl"] += float(((old - refs[i]) * b.response_mask).sum()) / max(total, 1.0)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.model.eval()
        elapsed = time.perf_counter() - t0
        stats.update(grad_norm=float(grad_norm), samples=len(samples), tokens=total, train_tok_s=total / elapsed)
        return stats


class LocalTrainer(TrainerBase):
    """Everything in this process: transformers generation, plain torch updates (see the module docstring)."""

    def __init__(self, cfg: TrainConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .models import resolve_model

        super().__init__(cfg)
        if cfg.train_batch:
            raise ValueError(
                "train_batch (several optimiser steps per iteration) is a Ray-trainer option; the local "
                "trainer takes one step per role and iteration"
            )
        torch.manual_seed(cfg.seed)
        path = resolve_model(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        shared = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) if cfg.share_model else None
        self.learners: dict[str, RoleLearner] = {}
        for role in self.roles:
            model = shared if shared is not None else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            self.learners[role] = RoleLearner(model, self.tokenizer, cfg)
        gen = GenerationConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        self._policies = {
            role: TransformersPolicy.from_model(lr.model, lr.tokenizer, gen, seed=cfg.seed)
            for role, lr in self.learners.items()
        }

    def policies(self) -> dict[str, TransformersPolicy]:
        return self._policies

    def eval_policies(self, temperature: float) -> dict[str, TransformersPolicy]:
        gen = GenerationConfig(max_new_tokens=self.cfg.max_new_tokens, temperature=temperature)
        return {
            role: TransformersPolicy.from_model(lr.model, lr.tokenizer, gen, seed=self.cfg.seed)
            for role, lr in self.learners.items()
        }

    def update(self, by_role: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        return {role: self.learners[role].update(samples) for role, samples in by_role.items()}

    def save_state(self, path: Path) -> None:
        # the policies generate with the learners' own modules: nothing to sync, the state is the learners'
        for role, learner in self.learners.items():
            torch.save(
                {"model": learner.model.state_dict(), "optimizer": learner.optimizer.state_dict()},
                path / f"{role}.pt",
            )

    def export_models(self, path: Path) -> None:
        for role, learner in self.learners.items():
            learner.model.save_pretrained(path / role)
            learner.tokenizer.save_pretrained(path / role)

    def load_state(self, path: Path) -> None:
        for role, learner in self.learners.items():
            state = torch.load(path / f"{role}.pt", weights_only=True)
            learner.model.load_state_dict(state["model"])
            learner.optimizer.load_state_dict(state["optimizer"])
