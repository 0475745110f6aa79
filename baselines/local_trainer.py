"""A single-process trainer for small models with plain transformers: REINFORCE++, GRPO or outcome-only.

For debugging and machines without Ray. It shares the estimators (:mod:`baselines.advantages`), the loss
(:mod:`baselines.losses`) and the sample code (:mod:`baselines.samples`) with the distributed trainer. One iteration:

1. roll out ``prompts_per_iteration x samples_per_prompt`` episodes with the current policies (generation batched
   per role), the coach scoring every action concurrently;
2. turn every action into a sample of its role (prompt = the agent's full context at that turn, response = the
   token ids the policy sampled), leaving out coach fallbacks and truncated responses (configurable);
3. per role: log-probs under the generating policy and the frozen reference, at the sampling temperature;
   advantages from the chosen estimator over the role's batch (or the team's); one pass of the PPO-style clipped
   loss (epsilon 0.2) in micro-batches with gradient accumulation, gradient clipping, an AdamW step (no weight
   decay, linear warm-up, as the reference).

Each role has its own weights, reference and optimiser, unless ``role_weights`` freezes it or has it share another
role's (``share_model=True``: every role on the first role's weights; :mod:`baselines.role_weights`).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from .advantages import RoleBatch, advantages_by_role
from .config import TrainConfig
from .loop import TrainerBase
from .losses import ppo_clip_loss
from .policies import GenerationConfig, TransformersPolicy
from .role_weights import role_models, weight_groups
from .samples import Sample, TokenBatch, autocast, token_logprobs, tokenize_samples

__all__ = ["LocalTrainer", "RoleLearner", "TrainConfig", "ppo_clip_loss", "scatter_responses"]


class RoleLearner:
    """One role's trainable model, frozen reference and optimiser."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, cfg: TrainConfig, trained: bool = True, reference: Any = None
    ):
        """``reference``: the frozen reference policy when the caller has one (a LoRA role's: its base with the
        adapters disabled, :mod:`baselines.lora`); otherwise a copy of ``model`` is taken."""
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
    def logprobs(self, batches: list[TokenBatch]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample: its response tokens' log-probs under the policy and under the reference (zeros when there is
        no KL term: they are not needed then)."""
        cfg = self.cfg
        logp: list[torch.Tensor] = []
        ref: list[torch.Tensor] = []
        self.model.eval()
        for b in batches:
            mask = b.response_mask.bool()
            if cfg.beta_kl:
                with autocast(cfg.resolved_autocast(), "cpu"):
                    lp = token_logprobs(self.model, b, cfg.temperature)
                    rf = token_logprobs(self.ref, b, cfg.temperature)
            else:
                lp = rf = torch.zeros(mask.shape)
            logp += [lp[i][mask[i]] for i in range(len(mask))]
            ref += [rf[i][mask[i]] for i in range(len(mask))]
        return logp, ref

    def step(self, batches: list[TokenBatch], advantages: list[torch.Tensor], lr: float) -> dict[str, float]:
        """One optimiser step: the PPO-clipped loss, averaged over the role's response tokens, against the policy
        that generated the samples (the current weights: ratio 1 in this single pass)."""
        cfg = self.cfg
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
            adv = scatter_responses(advantages[row : row + len(b.input_ids)], b.response_mask)
            row += len(b.input_ids)
            loss, info = ppo_clip_loss(logp, logp.detach(), adv, b.response_mask, cfg.clip_eps)
            weight = float(b.response_mask.sum()) / max(total, 1.0)
            (loss * weight).backward()
            stats["loss"] += float(loss.detach()) * weight
            stats["clip_frac"] += info["clip_frac"] * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.model.eval()
        elapsed = time.perf_counter() - t0
        stats.update(grad_norm=float(grad_norm), lr=lr, train_tok_s=total / elapsed if elapsed else 0.0)
        return stats

    def update(self, samples: list[Sample], lr: float | None = None) -> dict[str, float]:
        """One role on its own: log-probs, advantages over its batch, one step (``lr``: default ``cfg.lr``)."""
        cfg = self.cfg
        batches = self.batches(samples)
        logp, ref = self.logprobs(batches)
        batch = RoleBatch(
            [s.reward for s in samples], [s.outcome for s in samples], [s.group_id for s in samples], logp, ref
        )
        adv = advantages_by_role(cfg.estimator, {"role": batch}, beta=cfg.beta_kl)["role"]
        return self.step(batches, adv, cfg.lr if lr is None else lr)


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
        # one learner (model, reference, optimiser) per set of trained weights; a shared role acts with its owner's
        self.groups = weight_groups(self.weights)
        self.learners: dict[str, RoleLearner] = {}
        own = {r: resolve_model(m) for r, m in role_models(self.weights, cfg.model).items() if m != cfg.model}
        for role in [r for r in self.roles if self.weights[r].kind in ("full", "frozen")]:
            model = AutoModelForCausalLM.from_pretrained(own.get(role, path), dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(own[role]) if role in own else self.tokenizer  # full@MODEL
            self.learners[role] = RoleLearner(model, tokenizer, cfg, trained=self.weights[role].kind == "full")
        lora = {r: self.weights[r].rank for r in self.roles if self.weights[r].kind == "lora"}
        if lora:  # one base for every LoRA role, an adapter each
            from .lora import SharedBase

            shared = SharedBase(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), lora)
            for role, view in shared.views.items():
                self.learners[role] = RoleLearner(view, self.tokenizer, cfg, reference=view.reference())
        for owner, roles in self.groups.items():
            self.learners.update({r: self.learners[owner] for r in roles})
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

    def update(self, by_role: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        cfg = self.cfg
        batches = {role: self.learners[role].batches(ss) for role, ss in by_role.items() if ss}
        inputs: dict[str, RoleBatch] = {}
        for role, bs in batches.items():
            logp, ref = self.learners[role].logprobs(bs)
            ss = by_role[role]
            inputs[role] = RoleBatch(
                [s.reward for s in ss], [s.outcome for s in ss], [s.group_id for s in ss], logp, ref
            )
        advantages = advantages_by_role(cfg.estimator, inputs, scope=cfg.advantage_scope, beta=cfg.beta_kl)
        out: dict[str, dict[str, Any]] = {}
        for role, ss in by_role.items():
            if not ss:
                out[role] = {"skipped": 1, "samples": 0, "tokens": 0}
                continue
            adv, inp = advantages[role], inputs[role]
            tokens = sum(len(a) for a in adv)
            out[role] = {
                "samples": len(ss),
                "tokens": tokens,
                "kl": float(sum((a - b).sum() for a, b in zip(inp.logp, inp.ref_logp, strict=True))) / max(tokens, 1),
                "adv_abs_mean": float(sum(a.abs().sum() for a in adv)) / max(tokens, 1),
                # stored episodes of another run: this trainer's ratio is its own pass's (1), never corrected
                **({"off_policy_uncorrected": len(ss)} if cfg.rollouts_from else {}),
            }
        # one step per set of weights, on the samples of every role that trains them (each role's advantages
        # normalised over its own samples above)
        for owner, roles in self.groups.items():
            live = [r for r in roles if r in batches]
            adv = [a for r in live for a in advantages[r]]
            if not live:
                continue
            if max(float(a.abs().max()) for a in adv) < 1e-8:
                # every advantage is 0 (equal rewards, no KL): the gradient is exactly 0, and an Adam step on it
                # would still move the weights by its momentum: skip the step
                out.update({r: {"skipped": 1, "loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, **out[r]} for r in live})
                continue
            step = self.learners[owner].step([b for r in live for b in batches[r]], adv, cfg.lr_at(self.iteration))
            out.update({r: {"skipped": 0, **step, **out[r]} for r in live})
        return out

    def save_state(self, path: Path) -> None:
        # the policies generate with the learners' own modules: nothing to sync, the state is the learners'
        for role, learner in self.learners.items():
            optimizer = learner.optimizer.state_dict() if learner.optimizer is not None else None
            torch.save({"model": learner.model.state_dict(), "optimizer": optimizer}, path / f"{role}.pt")

    def export_models(self, path: Path) -> None:
        for role, learner in self.learners.items():
            learner.model.save_pretrained(path / role)
            learner.tokenizer.save_pretrained(path / role)

    def load_state(self, path: Path) -> None:
        for role, learner in self.learners.items():
            state = torch.load(path / f"{role}.pt", weights_only=True)
            learner.model.load_state_dict(state["model"])
            if learner.optimizer is not None:
                learner.optimizer.load_state_dict(state["optimizer"])
