"""The options of ``mappa train`` that each set one :class:`~baselines.config.TrainConfig` field: one table, from
which both the parser and the configuration's overrides are made (:func:`benchmarks.commands.train.train_config`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One option of ``mappa train``: the :class:`~baselines.config.TrainConfig` field it sets and its argparse
    arguments. ``const``: a flag without a value that sets the field to ``const``."""

    flag: str
    field: str
    help: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    const: Any = None

    def add_to(self, p: argparse.ArgumentParser) -> None:
        if self.const is not None:
            p.add_argument(self.flag, dest=self.field, action="store_const", const=self.const, help=self.help)
        else:
            kwargs = dict(self.kwargs)
            if "choices" not in kwargs:  # the flag's name, not the field's: --out OUT
                kwargs.setdefault("metavar", self.flag.lstrip("-").upper().replace("-", "_"))
            p.add_argument(self.flag, dest=self.field, default=None, help=self.help, **kwargs)


def _o(flag: str, name: str, help: str = "", **kwargs: Any) -> Option:
    return Option(flag, name, help, kwargs)


TRAIN_OPTIONS: tuple[Option, ...] = (
    _o("--trainer", "trainer", "ray (vLLM + DeepSpeed ZeRO-3, default) | local (one process)"),
    _o("--iterations", "iterations", type=int),
    _o("--model", "model", "smollm2-135m | tiny-random | a model folder"),
    _o("--estimator", "estimator", "reinforce_pp | grpo | outcome | a registered plug-in (entry points)"),
    _o(
        "--coach",
        "coach",
        "rule | rule-hindsight (scores each episode whole, knowing its outcome) | none | module:factory",
    ),
    _o("--world-size", "world_size", "DeepSpeed ranks per role (ray trainer)", type=int),
    _o("--prompts-per-iteration", "prompts_per_iteration", type=int),
    _o("--samples-per-prompt", "samples_per_prompt", type=int),
    _o("--concurrency", "concurrency", "episodes stepped together", type=int),
    _o("--train-batch", "train_batch", "samples per optimiser step (ray trainer)", type=int),
    _o(
        "--role-weights",
        "role_weights",
        "a role's weights, repeatable: ROLE=full | ROLE=frozen | ROLE=shared:OTHER_ROLE (local trainer)",
        action="append",
        metavar="ROLE=SPEC",
    ),
    _o(
        "--place",
        "placement",
        "on a Ray cluster: ACTOR=RESOURCE, repeatable; ACTOR is engines, trainers, ROLE, engine:ROLE or trainer:ROLE, "
        "RESOURCE a custom resource of the nodes it may run on",
        action="append",
        metavar="ACTOR=RESOURCE",
    ),
    _o(
        "--rollout-is-cap",
        "rollout_is_cap",
        "truncated importance sampling of the engines' numerics: min(pi_trainer/pi_engine, CAP) per token (0: off)",
        type=float,
    ),
    _o(
        "--rollouts-from",
        "rollouts_from",
        "a run folder: train on its stored episodes, re-scored by --coach, instead of new rollouts (off-policy)",
        metavar="RUN",
    ),
    _o("--eval-split", "eval_split", "held-out split (tasks with named splits)"),
    _o("--eval-extra-split", "eval_extra_splits", "another held-out split, repeatable", action="append", metavar="S"),
    Option(
        "--unseal-test",
        "unseal_test",
        "evaluate a sealed test split (pre-registered runs only: every evaluation is logged, mappa_envs.sealed)",
        const=True,
    ),
    _o("--eval-episodes", "eval_episodes", "held-out problems before and after training", type=int),
    _o("--eval-samples", "eval_samples", "samples per held-out problem", type=int),
    _o("--lr", "lr", "learning rate", type=float),
    _o("--weight-decay", "weight_decay", "AdamW weight decay", type=float),
    _o("--warmup-ratio", "warmup_ratio", "fraction of iterations of linear lr warm-up", type=float),
    _o("--lr-schedule", "lr_schedule", "after the warm-up (default cosine)", choices=("cosine", "constant")),
    _o("--advantage-scope", "advantage_scope", "where advantages are normalised", choices=("role", "team")),
    Option(
        "--keep-coach-fallbacks",
        "mask_coach_fallbacks",
        "train on actions whose coach evaluation is a fallback (default: masked out of the loss)",
        const=False,
    ),
    _o("--truncated", "truncated", "responses cut at --max-new-tokens: mask | keep", choices=("mask", "keep")),
    _o("--temperature", "temperature", "sampling temperature of the rollouts", type=float),
    _o("--max-new-tokens", "max_new_tokens", "tokens per reply", type=int),
    _o("--micro-batch", "micro_batch", "sequences per forward/backward pass", type=int),
    _o(
        "--pack-tokens",
        "pack_tokens",
        "forward/backward over prefix-shared packs of at most this many distinct tokens (0: padded micro-batches)",
        type=int,
    ),
    Option(
        "--no-share-prefix",
        "share_prefix",
        "with --pack-tokens: run the prefix every sample shares with each pack, not once per batch",
        const=False,
    ),
    _o("--zero-stage", "zero_stage", "DeepSpeed ZeRO stage", type=int, choices=(0, 1, 2, 3)),
    Option("--gradient-checkpointing", "gradient_checkpointing", "recompute activations in the backward", const=True),
    Option(
        "--no-rollout-logprobs",
        "rollout_logprobs",
        "recompute the policy's log-probs in the trainer instead of taking the engine's (distributed trainer)",
        const=False,
    ),
    _o("--checkpoint-every", "checkpoint_every", "iterations between checkpoints (0: last only)", type=int),
    Option(
        "--concurrent-generation",
        "concurrent_generation",
        "let the roles' engines generate at the same time on CPU too (the GPU default; slower on a CPU)",
        const=True,
    ),
    _o("--engine-kv-cache-gb", "engine_kv_cache_gb", "vLLM KV cache per engine on CPU (GiB)", type=float),
    _o(
        "--engine-dtype",
        "engine_dtype",
        "the vLLM engines' dtype: float32, bfloat16, or auto (bfloat16 where the device computes it natively)",
        choices=("auto", "float32", "bfloat16"),
    ),
    Option(
        "--no-memory-check",
        "memory_check",
        "start even if the estimated peak memory exceeds what is free",
        const=False,
    ),
    _o("--out", "out_dir", "output folder (default: the preset's)"),
    _o("--seed", "seed", type=int),
    Option("--no-resume", "resume", "start afresh even if --out holds a checkpoint", const=False),
    Option("--no-progress", "progress", "no progress bar", const=False),
)
"""Every option of ``mappa train`` that sets one :class:`~baselines.config.TrainConfig` field (``--env`` and
``--env-arg``, which set two, are handled by :func:`train_config`)."""
