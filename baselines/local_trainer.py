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
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mappa_envs
from mappa_envs.core import EpisodeRecord, write_jsonl

from .advantages import AdvantageBatch, compute_advantages
from .policies import GenerationConfig, TransformersPolicy
from .rollout import run_episodes
from .samples import Sample, samples_from_episodes, token_logprobs, tokenize_samples


@dataclass
class TrainConfig:
    """Configuration of :class:`LocalTrainer` (every field has a default that runs on a CPU)."""

    env_id: str = "mappa/MathChat-v0"
    """Registered environment to train on."""
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "arith-train"})
    """Arguments of the training environment."""
    model: str = "smollm2-135m"
    """Model of every role: 'smollm2-135m' (bundled), a folder, or an HF id on disk."""
    estimator: str = "reinforce_pp"
    """Advantage estimator: reinforce_pp | grpo | outcome."""
    coach: str = "rule"
    """Process-reward coach: 'rule' (RuleBasedCoach) or 'none' (outcome-only runs)."""
    iterations: int = 2
    prompts_per_iteration: int = 4
    samples_per_prompt: int = 2
    """Episodes per task per iteration (GRPO needs 2 or more)."""
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.95)
    beta_kl: float = 0.01
    """Weight of the per-token KL penalty against the reference model."""
    clip_eps: float = 0.2
    grad_clip: float = 1.0
    micro_batch: int = 4
    """Sequences per forward/backward pass (gradients are accumulated over the role's batch)."""
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 128
    temperature: float = 1.0
    share_model: bool = False
    concurrency: int = 8
    seed: int = 0
    out_dir: str = "runs/train-local"


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


class LocalTrainer:
    def __init__(self, cfg: TrainConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .models import resolve_model

        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        probe = mappa_envs.make(cfg.env_id, **cfg.env_kwargs)
        self.roles = [r.name for r in probe.unwrapped.roles]
        self.n_tasks = len(probe.unwrapped.tasks)
        probe.close()
        path = resolve_model(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        shared = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) if cfg.share_model else None
        self.learners: dict[str, RoleLearner] = {}
        for role in self.roles:
            model = shared if shared is not None else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            self.learners[role] = RoleLearner(model, self.tokenizer, cfg)
        gen = GenerationConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        self.policies = {
            role: TransformersPolicy.from_model(lr.model, lr.tokenizer, gen, seed=cfg.seed)
            for role, lr in self.learners.items()
        }
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self._rng = np.random.default_rng(cfg.seed)

    def _env_fn(self):
        env = mappa_envs.make(self.cfg.env_id, **self.cfg.env_kwargs)
        if self.cfg.coach == "rule":
            from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach

            env = CoachRewardWrapper(env, RuleBasedCoach())
        elif self.cfg.coach != "none":
            raise ValueError(f"coach must be 'rule' or 'none', not {self.cfg.coach!r}")
        return env

    def rollout(self, iteration: int) -> list[EpisodeRecord]:
        cfg = self.cfg
        tasks = self._rng.choice(self.n_tasks, size=cfg.prompts_per_iteration, replace=False)
        k = cfg.samples_per_prompt
        return run_episodes(
            self._env_fn,
            self.policies,
            cfg.prompts_per_iteration * k,
            seed=cfg.seed + 10_000 * iteration,
            concurrency=cfg.concurrency,
            reset_options=lambda i: {"task_index": int(tasks[i // k])},
        )

    def train_iteration(self, iteration: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        gen_before = sum(p.generated_tokens for p in self.policies.values())
        records = self.rollout(iteration)
        gen_time = time.perf_counter() - t0
        generated = sum(p.generated_tokens for p in self.policies.values()) - gen_before
        write_jsonl(self.out / "trajectories.jsonl", records, append=True)
        by_role = samples_from_episodes(records)
        metrics: dict[str, Any] = {
            "iteration": iteration,
            "episodes": len(records),
            "accuracy": float(np.mean([bool(r.outcome.get("correct")) for r in records])),
            "gen_tok_s": generated / gen_time,
        }
        for role, samples in by_role.items():
            stats = self.learners[role].update(samples)
            tool = [c for r in records for a in r.actions if a.role == role for c in a.tool_calls]
            metrics[role] = {
                "mean_coach_score": float(np.mean([s.reward for s in samples]) * 10),
                "tool_call_rate": len(tool) / len(samples),
                "tool_success_rate": (sum(c.result.ok for c in tool) / len(tool)) if tool else 0.0,
                "response_chars": float(np.mean([len(s.response) for s in samples])),
                **stats,
            }
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        return metrics

    def train(self) -> list[dict[str, Any]]:
        (self.out / "config.json").write_text(json.dumps(asdict(self.cfg), indent=2))
        return [self.train_iteration(i) for i in range(self.cfg.iterations)]
