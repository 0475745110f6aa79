"""A single-process trainer for small models with plain transformers: REINFORCE++, GRPO or outcome-only.

For debugging and machines without Ray. It shares the estimators (:mod:`baselines.algorithm.advantages`), the loss
(:mod:`baselines.algorithm.losses`) and the sample code (:mod:`baselines.algorithm.samples`) with the distributed
trainer. One iteration:

1. roll out ``prompts_per_iteration x samples_per_prompt`` episodes with the current policies (generation batched
   per role), the coach scoring every action concurrently;
2. turn every action into a sample of its role (prompt = the agent's full context at that turn, response = the
   token ids the policy sampled), leaving out coach fallbacks and truncated responses (configurable);
3. the update, written once for both trainers (:func:`baselines.training.update.update`), asks each set of
   weights' :class:`LocalLearner` for log-probs under the policy and the frozen reference, at the sampling
   temperature, and for its optimiser steps: the PPO-style clipped loss (epsilon 0.2) in micro-batches with
   gradient accumulation, gradient clipping, an AdamW step (no weight decay, linear warm-up, as the reference).

Each role has its own weights, reference and optimiser, unless ``role_weights`` freezes it or has it share another
role's (``share_model=True``: every role on the first role's weights; :mod:`baselines.weights.role_weights`).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from baselines.algorithm.learner import Done, LogProbs, StepStats
from baselines.algorithm.losses import ppo_clip_loss
from baselines.algorithm.samples import Sample, TokenBatch, autocast, token_logprobs, tokenize_samples
from baselines.config import TrainConfig
from baselines.training.loop import TrainerBase
from baselines.weights.lora import SharedBase
from baselines.weights.models import resolve_model
from baselines.weights.policies import GenerationConfig, TransformersPolicy
from baselines.weights.role_weights import role_models

# transformers is imported when a trainer is built: importing the module loads only torch.

__all__ = ["LocalLearner", "LocalTrainer", "RoleLearner", "TrainConfig", "ppo_clip_loss", "scatter_responses"]


class RoleLearner:
    """One role's trainable model, frozen reference and optimiser."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, cfg: TrainConfig, trained: bool = True, reference: Any = None
    ):
        """``reference``: the frozen reference policy when the caller has one (a LoRA role's: its base with the
        adapters disabled, :mod:`baselines.weights.lora`); otherwise a copy of ``model`` is taken."""
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        if not trained:  # a frozen role: it acts, and holds no reference or optimiser
            model.requires_grad_(False)
            self.ref, self.optimizer = model, None
            return
        if reference is not None:
            self.ref = reference
        else:
            self.ref = copy.deepcopy(model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )

    def batches(self, samples: list[Sample]) -> list[TokenBatch]:
        cfg = self.cfg
        return [
            tokenize_samples(
                samples[i : i + cfg.micro_batch], self.tokenizer, cfg.max_prompt_tokens, cfg.max_new_tokens + 1
            )
            for i in range(0, len(samples), cfg.micro_batch)
        ]

    @torch.no_grad()
    def logprobs(
        self, batches: list[TokenBatch], *, policy: bool = True, reference: bool = True
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Per sample: its response tokens' log-probs under the policy and under the reference, at the sampling
        temperature; None in place of a pass not asked for."""
        cfg = self.cfg
        logp: list[torch.Tensor | None] = []
        ref: list[torch.Tensor | None] = []
        self.model.eval()
        for b in batches:
            mask = b.response_mask.bool()
            rows = range(len(mask))
            with autocast(cfg.resolved_autocast(), "cpu"):
                lp = token_logprobs(self.model, b, cfg.temperature) if policy else None
                rf = token_logprobs(self.ref, b, cfg.temperature) if reference else None
            logp += [lp[i][mask[i]] if lp is not None else None for i in rows]
            ref += [rf[i][mask[i]] if rf is not None else None for i in rows]
        return logp, ref

    def step(
        self,
        batches: list[TokenBatch],
        advantages: list[torch.Tensor],
        lr: float,
        old_logp: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One optimiser step: the PPO-clipped loss, averaged over the batches' response tokens. ``old_logp`` (per
        sample): the ratio's old log-probs; None: the step's own forward, detached (ratio 1: the only step on
        samples these weights generated)."""
        cfg = self.cfg
        if self.optimizer is None:
            raise ValueError("a frozen role takes no optimiser step")
        t0 = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = float(sum(b.response_mask.sum() for b in batches))
        stats = {"loss": 0.0, "clip_frac": 0.0}
        row = 0
        for b in batches:
            with autocast(cfg.resolved_autocast(), "cpu"):
                logp = token_logprobs(self.model, b, cfg.temperature)
            rows = slice(row, row + len(b.input_ids))
            adv = scatter_responses(advantages[rows], b.response_mask)
            old = logp.detach() if old_logp is None else scatter_responses(old_logp[rows], b.response_mask)
            row += len(b.input_ids)
            loss, info = ppo_clip_loss(logp, old, adv, b.response_mask, cfg.clip_eps)
            weight = float(b.response_mask.sum()) / max(total, 1.0)
            (loss * weight).backward()
            stats["loss"] += float(loss.detach()) * weight
            stats["clip_frac"] += info["clip_frac"] * weight
        t_backward = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.model.eval()
        end = time.perf_counter()
        stats.update(
            grad_norm=float(grad_norm),
            lr=lr,
            tokens=total,
            seconds=end - t0,
            forward_backward_s=t_backward - t0,
            optimizer_s=end - t_backward,
            train_tok_s=total / (end - t0) if end > t0 else 0.0,
        )
        return stats


class LocalLearner:
    """The :class:`~baselines.algorithm.learner.Learner` of one set of weights in this process: a :class:`RoleLearner`'s
    passes and steps, which have finished when they return."""

    def __init__(self, name: str, inner: RoleLearner):
        self.name, self.inner = name, inner

    def logprobs(self, samples: list[Sample], *, policy: bool, reference: bool) -> Done[LogProbs]:
        return Done(LogProbs(*self.inner.logprobs(self.inner.batches(samples), policy=policy, reference=reference)))

    def step(
        self,
        samples: list[Sample],
        advantages: list[torch.Tensor],
        lr: float,
        *,
        old_logp: list[torch.Tensor] | None = None,
        behaviour_logp: list[torch.Tensor] | None = None,
    ) -> Done[StepStats]:
        """One step (``behaviour_logp`` is not used: this process's policies record no log-probs at sampling)."""
        s = self.inner.step(self.inner.batches(samples), advantages, lr, old_logp)
        fields = ("loss", "clip_frac", "grad_norm", "lr", "seconds", "forward_backward_s", "optimizer_s")
        return Done(StepStats(**{k: s[k] for k in fields}, rank_tokens=[int(s["tokens"])]))

    def sync(self) -> None:
        return None  # the policies generate with this learner's own modules

    def save(self, path: Path) -> None:
        optimizer = self.inner.optimizer.state_dict() if self.inner.optimizer is not None else None
        torch.save({"model": self.inner.model.state_dict(), "optimizer": optimizer}, path / f"{self.name}.pt")

    def load(self, path: Path) -> None:
        state = torch.load(path / f"{self.name}.pt", weights_only=True)
        self.inner.model.load_state_dict(state["model"])
        if self.inner.optimizer is not None:
            self.inner.optimizer.load_state_dict(state["optimizer"])

    def export(self, path: Path) -> None:
        self.inner.model.save_pretrained(path)
        self.inner.tokenizer.save_pretrained(path)


def scatter_responses(rows: list[torch.Tensor], response_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample response vectors placed at their tokens' positions of a ``[B, L-1]`` response mask."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    mask = response_mask.bool()
    for i, r in enumerate(rows):
        out[i][mask[i]] = r.to(out)
    return out


class LocalTrainer(TrainerBase):
    """Everything in this process: transformers generation, plain torch updates (see the module docstring)."""

    kind = "local"

    def __init__(self, cfg: TrainConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        super().__init__(cfg)
        torch.manual_seed(cfg.seed)
        path = resolve_model(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # one learner (model, reference, optimiser) per set of weights; a shared role acts with its owner's
        self.learners: dict[str, RoleLearner] = {}
        own = {r: resolve_model(m) for r, m in role_models(self.weights, cfg.model).items() if m != cfg.model}
        for role in [r for r in self.roles if self.weights[r].kind in ("full", "frozen")]:
            model = AutoModelForCausalLM.from_pretrained(own.get(role, path), dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(own[role]) if role in own else self.tokenizer  # full@MODEL
            self.learners[role] = RoleLearner(model, tokenizer, cfg, trained=self.weights[role].kind == "full")
        lora = {r: self.weights[r].rank for r in self.roles if self.weights[r].kind == "lora"}
        if lora:  # one base for every LoRA role, an adapter each
            shared = SharedBase(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), lora)
            for role, view in shared.views.items():
                self.learners[role] = RoleLearner(view, self.tokenizer, cfg, reference=view.reference())
        self.learners.update({r: self.learners[self.owner[r]] for r in self.roles})
        learner = {role: LocalLearner(role, self.learners[role]) for role in self.roles if self.owner[role] == role}
        self.learner_of = {role: learner[self.owner[role]] for role in self.roles}
        gen = GenerationConfig(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, max_prompt_tokens=cfg.max_prompt_tokens
        )
        self._policies = {
            role: TransformersPolicy.from_model(lr.model, lr.tokenizer, gen, seed=cfg.seed)
            for role, lr in self.learners.items()
        }
        self.start_coach()  # --coach vllm:MODEL: the coach's server, on this machine

    def policies(self) -> dict[str, TransformersPolicy]:
        return self._policies

    def eval_policies(self, temperature: float) -> dict[str, TransformersPolicy]:
        gen = GenerationConfig(
            max_new_tokens=self.cfg.max_new_tokens,
            temperature=temperature,
            max_prompt_tokens=self.cfg.max_prompt_tokens,
        )
        return {
            role: TransformersPolicy.from_model(lr.model, lr.tokenizer, gen, seed=self.cfg.seed)
            for role, lr in self.learners.items()
        }
