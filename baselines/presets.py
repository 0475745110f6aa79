"""Named training configurations for ``mappa train --preset NAME``.

``paper-*`` presets carry the reference hyperparameters of the method (METHOD.md): lr 1e-6, 2 samples per prompt,
rollout batch of 32 prompts (MathChat) / 16 (DSBench), temperature 1.0, KL weight 0.01, clip 0.2, Adam betas
(0.9, 0.95), gradient clip 1.0. They are meant for GPUs and larger models (pass ``--model``).
"""

from __future__ import annotations

from dataclasses import replace

from .config import TrainConfig

PRESETS: dict[str, TrainConfig] = {
    # Two iterations of the distributed trainer on a tiny random model, a handful of short episodes: proves the
    # whole stack (Ray, vLLM engines, DeepSpeed ZeRO-3, weight sync, checkpoints) end to end in a few minutes. The
    # length coach gives the random model's actions varying scores, so every role really updates.
    "smoke": TrainConfig(
        model="tiny-random",
        coach="mappa_envs.coach:LengthCoach",
        iterations=2,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=32,
        max_prompt_tokens=768,
        lr=1e-4,
        concurrency=4,
        out_dir="runs/smoke",
    ),
    # The README's main job: the bundled SmolLM2-135M per role, REINFORCE++ with the rule-based coach, easy
    # arithmetic word problems (a training pool, not a benchmark), held-out problems evaluated before and after.
    # Sized for 2 CPU cores and 24 GB, where three vLLM engines (~2.8 GB each) and three trainer ranks share them:
    # ZeRO stage 0 (one rank per role: ZeRO-3 would only add ~2 GB per role) and gradient checkpointing.
    "demo": TrainConfig(
        iterations=4,
        prompts_per_iteration=8,
        samples_per_prompt=1,
        max_new_tokens=128,
        max_prompt_tokens=1024,
        lr=2e-5,
        temperature=0.7,
        micro_batch=2,
        zero_stage=0,
        gradient_checkpointing=True,
        concurrency=16,
        eval_episodes=16,
        eval_split="arith-eval",
        out_dir="runs/demo",
    ),
    "paper-mathchat": TrainConfig(
        env_kwargs={"split": "aime-train"},
        iterations=100,
        prompts_per_iteration=32,
        samples_per_prompt=2,
        max_new_tokens=4096,
        max_prompt_tokens=8192,
        lr=1e-6,
        temperature=1.0,
        micro_batch=4,
        train_batch=16,
        concurrency=64,
        out_dir="runs/paper-mathchat",
    ),
    "paper-dsbench": TrainConfig(
        env_id="mappa/DSBench-v0",
        env_kwargs={"suite": "lite", "split": "train"},
        eval_split="eval",
        iterations=100,
        prompts_per_iteration=16,
        samples_per_prompt=2,
        max_new_tokens=4096,
        max_prompt_tokens=8192,
        lr=1e-6,
        temperature=1.0,
        micro_batch=4,
        train_batch=16,
        concurrency=32,
        out_dir="runs/paper-dsbench",
    ),
}


def preset(name: str, **overrides) -> TrainConfig:
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
