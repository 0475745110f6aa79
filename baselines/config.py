"""Training configuration shared by the single-process and the distributed trainer (``mappa train``)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

import sandboxes
from baselines.fields import choices, one_of, option
from baselines.weights import dtypes
from baselines.weights.role_weights import spec_forms_help
from mappa_envs.coach import coach_from_spec
from mappa_envs.coach.information import reward_information
from mappa_envs.coach.rescore import coach_specs_help
from mappa_envs.sealed import code_version

# torch and the estimators (baselines.algorithm.advantages, which imports torch) are imported inside the functions that
# use them: importing this module (the CLI, the checks, a dry run) loads none of them.

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""A weights dtype: 'auto' is resolved by the device (:meth:`TrainConfig.resolved_dtype`)."""


SPEC = "vllm:"
"""The coach spec prefix of a coach the trainer serves itself (:mod:`baselines.ray_learner.coach_engine`)."""

SERVED_NAME = "coach"


def served_model(spec: str) -> str | None:
    """MODEL of ``vllm:MODEL`` (a bundled key, a folder, an id on disk), else None."""
    return spec[len(SPEC) :] if spec.startswith(SPEC) else None


@dataclass
class TrainConfig:
    """Every field has a default that runs on a CPU; presets (:mod:`baselines.planning.presets`) override a few.

    Each field is an option of ``mappa train`` (:mod:`baselines.fields`): its type says how it is given, the first
    sentence of its docstring is the flag's help, and :func:`~baselines.fields.option` adds a flag spelled otherwise
    and whether a resumed run may change it (``resume_may_change``: :func:`baselines.runs.store.check_resumable`)."""

    # --- task and method
    env_id: str = option("mappa/MathChat-v0", flag="--env")
    """Registered environment to train on."""
    env_kwargs: dict[str, Any] = option(default_factory=lambda: {"split": "arith-train"}, flag="--env-arg")  # noqa: RUF009
    """Arguments of the training environment (on the command line: JSON values)."""
    model: str = "smollm2-135m"
    """Model of every role: 'smollm2-135m' (bundled), 'tiny-random' (tests), a folder, or an HF id on disk."""
    estimator: str = "reinforce_pp"
    """Advantage estimator: reinforce_pp, grpo, outcome or a registered plug-in
    (:mod:`baselines.algorithm.advantages`)."""
    advantage_scope: Literal["role", "team"] = "role"
    """Where advantages are normalised: 'role' (each role's global batch, the reference) or 'team' (every role's
    samples together, docs/method.md's option)."""
    mask_coach_fallbacks: bool = option(True, negative="--keep-coach-fallbacks")
    """Leave actions whose coach evaluation is a fallback (no score parsed, the call failed) out of the loss. Their
    5/10 is not a judgement, and after normalisation it is not neutral either. Counted per role in the metrics."""
    truncated: Literal["mask", "keep"] = "mask"
    """Responses cut at ``max_new_tokens`` (no end-of-sequence token sampled): 'mask' leaves them out of the loss,
    'keep' trains on the tokens sampled (no EOS added). 'mask' is the reference's ``mask_truncated_completions``."""
    coach: str = option(
        "rule",
        help="Process-reward coach: "
        + coach_specs_help(
            {
                "vllm:MODEL": "the LLM coach served by the trainer itself: a `vllm serve` of MODEL (a bundled key, a "
                "folder, an id on disk) started beside the roles' engines (--place coach=RESOURCE), stopped at the end",
                "none": "no coach (outcome-only runs)",
            }
        ),
    )
    """Process-reward coach: a spec of :data:`mappa_envs.coach.rescore.COACH_SPECS` (the flag's help lists each with
    what it sees), or 'none' (outcome-only runs). 'rule' is :class:`~mappa_envs.coach.RuleBasedCoach`, the
    rule-based stand-in for the method's LLM coach; 'rule-hindsight' is the answer-key hindsight coach
    (``rule-hindsight-key``)."""
    coach_max_new_tokens: int | None = option(None, metavar="N")
    """An LLM coach's reply budget in tokens (``llm:``, ``llm-hindsight:``; default 512 a call, 1024 for the
    whole-episode form); the rule coaches generate nothing and refuse it."""
    share_model: bool = False
    """One model for every role: the same as ``role_weights`` with every other role ``shared:<first role>``; the
    default gives each role its own weights."""
    role_weights: dict[str, str] = option(  # noqa: RUF009
        default_factory=dict,
        metavar="ROLE=SPEC",
        help="Which weights each role acts and learns with, ROLE=SPEC (a role not named: full); the specs: "
        + spec_forms_help(),
    )
    """Which weights each role acts and learns with: ROLE=SPEC, a spec of
    :data:`baselines.weights.role_weights.SPEC_FORMS` (a key given twice: the last wins); both trainers take every form
    (:mod:`baselines.weights.role_weights`)."""

    # --- schedule
    iterations: int = option(2, resume_may_change=True)
    """Training iterations, each rollouts then every role's update. A resumed run may extend them (its
    after-training evaluation is then made again)."""
    prompts_per_iteration: int = 4
    """Tasks drawn per iteration, each played ``samples_per_prompt`` times."""
    samples_per_prompt: int = 2
    """Episodes per task per iteration (GRPO needs 2 or more)."""
    concurrency: int = option(8, resume_may_change=True)
    """Episodes stepped together during rollouts (generation is batched per role across them). A resumed run may
    change it: it changes which samples a seed draws, not the experiment."""
    seed: int = 0
    """Random seed of the run."""

    # --- optimisation (the reference values of docs/method.md where it gives them)
    lr: float = 1e-6
    """Learning rate at the end of the warm-up, the schedule's peak (:meth:`lr_at`)."""
    betas: tuple[float, float] = option((0.9, 0.95), metavar=("BETA1", "BETA2"))
    """AdamW's betas."""
    weight_decay: float = 0.0
    """AdamW weight decay (the reference: 0; torch's default 0.01 would move weights on zero gradients)."""
    warmup_ratio: float = 0.03
    """Fraction of the iterations of linear learning-rate warm-up: the first ``ceil(warmup_ratio * iterations)``
    (reference: 3%)."""
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    """The learning rate after the warm-up: 'cosine' decays to ``min_lr_ratio * lr`` at the last iteration (the
    reference's ``cosine_with_min_lr``), 'constant' stays at ``lr``."""
    min_lr_ratio: float = 0.1
    """The cosine schedule's floor as a share of ``lr`` (reference: 0.1)."""
    beta_kl: float = 0.01
    """Weight of the per-token KL penalty against the role's frozen reference model."""
    kl_only_updates: bool = False
    """Step on a role's batch whose reward is the same for every sample (every outcome 0, equal scores): its
    advantages are then the KL term alone, whitened to unit scale. Off: no step on it, counted per role as
    ``no_signal`` in metrics.jsonl."""
    clip_eps: float = 0.2
    """The clipped policy ratio's range: [1 - clip_eps, 1 + clip_eps]."""
    grad_clip: float = 1.0
    """Gradients clipped to this norm at each optimiser step."""
    micro_batch: int = option(4, resume_may_change=True)
    """Sequences per forward/backward pass (gradients are accumulated over the role's batch). Like every resource
    option a resumed run may change it: the same log-probs and gradients (a run that ran out of memory resumes with
    less)."""
    pack_tokens: int = option(0, resume_may_change=True)
    """Distributed trainer: forward/backward passes over prefix-shared packs of at most this many distinct tokens
    (0: padded micro-batches of ``micro_batch`` rows). A prefix several samples share - the system prompt, an
    agent's earlier turns, a GRPO group's prompt - is computed once (:mod:`baselines.ray_learner.packing`); same
    log-probs and gradients. Full attention only: a model with a sliding window shorter than a row, or layers of another
    kind, is refused before any actor starts (:func:`baselines.weights.shapes.packing_problem`)."""
    share_prefix: bool = option(True, resume_may_change=True)
    """With ``pack_tokens``: run the prefix all of a rank's samples of a role share once per pass over the batch,
    not once per pack. That prefix (system prompt, worked example; at most ``pack_tokens // 2`` tokens) is attended
    to by every pack (same log-probs and gradients up to float rounding). With gradient checkpointing the packs'
    layers are checkpointed and the prefix's pass is not (its activations, at most half a pack, are kept for the
    step). Full-attention models only (``pack_tokens``)."""
    train_batch: int | None = None
    """Samples per optimiser step (None: one step per iteration). A set of weights' batch is split into shuffled
    mini-batches of this size, one step each, against the log-probs of the policy before the first step (a policy
    pass gives them)."""

    rollout_logprobs: bool = True
    """Take the sampled tokens' log-probs from the vLLM engine that sampled them instead of recomputing them in a
    forward pass (the distributed trainer's engines record them; the single-process trainer's policies do not).
    Where a set of weights takes one optimiser step on its samples (``train_batch`` None), the engine's log-probs
    (at the sampling temperature) are the policy's for the KL term; the step's ratio then uses its own forward pass,
    detached. The engine's and the trainer's numerics differ slightly: their mean absolute gap per token is logged
    per role as ``rollout_logp_gap``. False: the trainer's own pass."""

    rollout_is_cap: float = 0.0
    """Truncated importance sampling of the rollout's numerics: each token's loss weighted by ``min(pi_trainer /
    pi_engine, rollout_is_cap)`` (distributed trainer, with the engine's log-probs; 0: off). It corrects the
    mismatch between the engine that sampled (bfloat16 engines) and the trainer's policy (Yao et al., 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"; verl's rollout importance sampling). Off by
    default (not yet measured on the demo). The mean weight is logged per role as ``is_weight_mean``."""

    rollouts_from: str | None = option(None, metavar="RUN")
    """A ``mappa train`` run folder whose stored episodes are trained on, re-scored by this run's ``coach``, instead
    of new rollouts. Each iteration's episodes are that run's stored episodes of the same iteration
    (``rollouts/iter-*.jsonl``), re-scored (``mappa rescore``, kept under ``rescored/``): coaches compared on
    identical episodes. Off-policy wherever the stored episodes were not sampled by the weights being trained (every
    iteration after the first): the distributed trainer then takes the stored log-probs of the sampling engine as
    the ratio's old log-probs, clipped as in the loss; episodes stored without them are trained on as if on-policy
    and counted per role (``off_policy_uncorrected``)."""

    # --- generation
    max_prompt_tokens: int = 1024
    """Prompt tokens a role sees at most (a longer context keeps its end: the latest instruction and feedback)."""
    max_new_tokens: int = 128
    """Tokens per reply at most."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    eval_temperature: float = 0.6
    """Sampling temperature of held-out evaluations."""
    eval_split: str | None = None
    """Held-out split of a task with named splits (None: the one the task declares for its training split). That is
    its ``heldout_kwargs``: MathChat's ``arith-train`` -> ``arith-eval``, ``aime-train`` -> ``aime-eval-32``;
    DSBench's ``train`` -> ``eval``."""
    eval_extra_splits: tuple[str, ...] = option((), flag="--eval-extra-split", metavar="S")
    """More held-out splits evaluated beside ``eval_split`` (the paper's MathChat: AMC-32 beside AIME-32)."""
    unseal_test: bool = False
    """Evaluate a sealed test split (``eval_split`` or an extra one; :mod:`mappa_envs.sealed`): only in a
    pre-registered run. Every evaluation is logged to the access log."""
    eval_samples: int = 1
    """Samples per held-out problem (accuracy is their mean, as the reference's ``eval_aggregation="mean"``)."""
    eval_episodes: int = 0
    """Held-out episodes evaluated before and after training by ``mappa train`` (0: none)."""

    # --- trainer and hardware (a resumed run may change the resources: the same log-probs and gradients)
    trainer: Literal["ray", "local"] = "ray"
    """'ray' (Ray + vLLM engines + DeepSpeed ZeRO-3, the default) or 'local' (one process, transformers)."""
    world_size: int = 1
    """DeepSpeed data-parallel ranks per role (distributed trainer)."""
    zero_stage: Literal[0, 1, 2, 3] = 3
    """DeepSpeed ZeRO stage of the trainer ranks (3 shards parameters, gradients and optimiser state over the
    ranks). With one rank per role ZeRO-3 only adds memory (its fp32 partitions and buckets: ~2 GB more per role
    for a 135M model, measured): the CPU demo uses 0."""
    gradient_checkpointing: bool = option(False, resume_may_change=True)
    """Recompute activations in the backward pass: much less memory for long team contexts, ~same speed on CPU."""
    placement: dict[str, str] = option(default_factory=dict, flag="--place", metavar="ACTOR=RESOURCE")  # noqa: RUF009
    """Distributed trainer on a Ray cluster: the custom resource each actor is placed by (ACTOR ``engines``,
    ``trainers``, ``ROLE``, ``engine:ROLE`` or ``trainer:ROLE``; :mod:`baselines.ray_learner.cluster`). Empty:
    anywhere."""
    parallel_updates: bool | None = option(None, resume_may_change=True)
    """Update all roles at once (None: on GPU yes, on CPU no). On a CPU they would share the same cores and the
    peak memory of three updates would add up."""
    concurrent_generation: bool | None = option(None, resume_may_change=True)
    """Let the roles' vLLM engines generate at the same time during rollouts (None: on GPU yes, on CPU no). On a CPU
    they would share the same cores: measured on 2 cores, three engines given their batches at once generated 38
    tok/s, one after the other 118 tok/s."""
    memory_check: bool = option(True, resume_may_change=True)
    """Refuse to start when the estimated peak memory (:mod:`baselines.planning.memory`) exceeds what the machine
    has."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """'cpu', 'cuda' or 'auto' (cuda when available)."""
    dtype: Dtype = "auto"
    """The trainer's weights: 'float32', 'bfloat16', 'float16' or 'auto' (bfloat16 on GPU, float32 on CPU)."""
    autocast: Literal["auto", "off", "bfloat16"] = "auto"
    """The trainer's matmuls: 'bfloat16' runs its forward passes under ``torch.autocast`` in bfloat16 while weights,
    gradients and optimiser state stay in ``dtype`` (mixed precision); 'off' computes in ``dtype``; 'auto' is
    bfloat16 when the weights are float32 and the device computes bfloat16 natively (a GPU, or a CPU with
    AVX512-BF16 or AMX: :func:`baselines.weights.dtypes.native_bf16`), else off. Measured on this project's 2-core AMX
    CPU with SmolLM2-135M, a lone 768-token forward+backward: 1.6 s under bfloat16 autocast, 3.2 s in float32 (the
    demo's updates were no shorter: docs/training.md)."""
    engine_dtype: Dtype = "auto"
    """The vLLM engines' weights (rollouts and held-out evaluation); 'auto': bfloat16 where the device computes it
    natively, else the trainer's dtype. Natively: a GPU, or a CPU with AVX512-BF16 or AMX
    (:func:`baselines.weights.dtypes.native_bf16`). Measured on this project's 2-core AVX512-BF16 CPU with SmolLM2-135M:
    bfloat16 generates 1.7-2x the tokens/s of float32 (``mappa bench``'s engine-dtype row), and its sampled tokens'
    log-probs differ from the float32 trainer's by 0.025 on average (0.2 at the 99th percentile; float32 engines:
    logged per role as ``rollout_logp_gap``). The trainer syncs its weights to the engines in this dtype."""
    engine_kv_cache_gb: float = option(1.0, resume_may_change=True)
    """vLLM KV cache per engine on CPU, GiB (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = option(0.25, resume_may_change=True)
    """Fraction of the GPU each vLLM engine takes (three roles share one GPU with their trainers)."""

    # --- outputs (a resumed run may change any of them)
    out_dir: str = option("runs/train", flag="--out", resume_may_change=True)
    """Output folder: checkpoints, stored episodes, metrics, evaluations, logs."""
    checkpoint_every: int = option(1, resume_may_change=True)
    """Save a checkpoint every N iterations (the last iteration is always saved); 0 saves only the last one."""
    keep_checkpoints: int = option(2, resume_may_change=True)
    """Checkpoints kept on disk (older ones are deleted)."""
    keep_finished_checkpoints: bool = option(False, resume_may_change=True)
    """Keep the checkpoints when the run has finished. By default ``mappa train`` removes them once every role's
    model is exported to ``models/``: they hold the optimiser state (about 4.6 GB for the demo's three 135M roles)
    and serve only to resume or extend the run, which then cannot be."""
    resume: bool = option(True, resume_may_change=True)
    """Continue from the latest checkpoint in ``out_dir`` and re-use its stored rollouts."""
    tensorboard: bool = option(True, resume_may_change=True)
    """Also log the metrics for TensorBoard (under ``out_dir``)."""
    wandb: bool = option(False, resume_may_change=True)
    """Also log to Weights & Biases (needs ``wandb`` installed and configured)."""
    progress: bool = option(True, resume_may_change=True)
    """A tqdm progress bar over episodes (on stderr)."""

    def warmup_iterations(self) -> int:
        """Iterations of linear learning-rate warm-up: ``ceil(warmup_ratio * iterations)``."""
        return math.ceil(self.warmup_ratio * self.iterations) if self.warmup_ratio > 0 else 0

    def lr_at(self, iteration: int) -> float:
        """Learning rate of ``iteration`` (0-based): ``lr * (i + 1) / (w + 1)`` during the ``w`` warm-up iterations
        (so no step is taken at 0), then ``lr`` ('constant') or a cosine from ``lr`` at iteration ``w`` down to
        ``min_lr_ratio * lr`` at the last one ('cosine', as the reference's ``cosine_with_min_lr``). Counted in
        iterations, where the reference counts optimiser steps: how many steps an iteration takes here depends on
        how many actions its episodes had, and every step of an iteration uses that iteration's rate."""
        w = self.warmup_iterations()
        if iteration < w:
            return self.lr * (iteration + 1) / (w + 1)
        if self.lr_schedule == "constant":
            return self.lr
        if self.lr_schedule != "cosine":
            raise ValueError(
                f"lr_schedule must be {one_of(choices(TrainConfig, 'lr_schedule'))}, not {self.lr_schedule!r}"
            )
        span = max(1, self.iterations - 1 - w)
        progress = min(1.0, (iteration - w) / span)
        floor = self.min_lr_ratio * self.lr
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            return "cpu"

    def resolved_engine_dtype(self) -> str:
        return dtypes.resolve_engine_dtype(self.engine_dtype, self.resolved_device(), self.resolved_dtype())

    def resolved_autocast(self) -> str | None:
        """The dtype the trainer's forward passes autocast to, or None (they compute in the weights' dtype)."""
        if self.autocast != "auto":
            return None if self.autocast == "off" else self.autocast
        return "bfloat16" if self.resolved_dtype() == "float32" and dtypes.native_bf16(self.resolved_device()) else None

    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.resolved_device() == "cuda" else "float32"


SANDBOX_RECORD_VAR = "MAPPA_SANDBOX_RECORD"
"""Set by ``mappa train`` for the run's process once it has picked the backend (with ``$MAPPA_SANDBOX``, which the
run's envs then use): the record of how it was picked, so that the run's ``config.json`` says ``auto``."""


def _sandbox_choice(spec: str | None, image: str | None) -> dict[str, Any]:
    chosen_by = "the env's sandbox argument"
    if spec is None:
        spec = sandboxes.default_backend()
        chosen_by = "auto" if spec == "auto" else f"${sandboxes.DEFAULT_BACKEND_VAR}"
    reasons: list[str] = []
    if spec == "auto":
        spec, reasons = sandboxes.auto_choice(**({"image": image} if image else {}))
        chosen_by = "auto"
    isolated = spec in ("docker", "bubblewrap", "sandboxfusion")
    return {"backend": spec, "isolated": isolated, "chosen_by": chosen_by, "passed_over": reasons}


def sandbox_choice(cfg: TrainConfig) -> dict[str, Any]:
    """The sandbox backend the run's envs execute agent code in: ``backend`` (``docker``, ``bubblewrap``,
    ``subprocess``...), ``isolated``, ``chosen_by`` (``auto``: the most isolating one that works here;
    ``$MAPPA_SANDBOX``; the env's ``sandbox`` argument) and, for ``auto``, why each more isolating one was
    passed over. ``mappa train`` prints it and records it in ``config.json``."""
    spec = cfg.env_kwargs.get("sandbox")
    image = (cfg.env_kwargs.get("sandbox_kwargs") or {}).get("image")
    picked = os.environ.get(SANDBOX_RECORD_VAR)
    if picked and spec is None:
        record = json.loads(picked)
        if record.get("backend") == os.environ.get("MAPPA_SANDBOX"):
            return record
    return _sandbox_choice(spec if isinstance(spec, str) else None, image)


def process_reward(cfg: TrainConfig) -> bool:
    """Whether the run's estimator trains on the coach's per-action scores (False: outcome only, no coach needed).
    An estimator not registered here counts as one that does: the checks report it."""
    try:
        from baselines.algorithm.advantages import uses_process_reward

        return uses_process_reward(cfg.estimator)
    except (ImportError, KeyError, ValueError):
        return True


def run_coach(cfg: TrainConfig, url: str | None = None, *, describe: bool = False) -> Any:
    """The coach ``cfg`` trains with, built from its spec and options (``coach_max_new_tokens``), as the trainer,
    the checks and ``config.json`` build it; ``ValueError`` for a spec or option it refuses. ``vllm:MODEL`` (a coach
    the trainer serves itself, :mod:`baselines.ray_learner.coach_engine`) is the LLM coach through the server at
    ``url``; ``describe``: a stand-in address, for what the coach is and sees, never called."""
    if served_model(cfg.coach) is not None:
        if url is None and not describe:
            raise ValueError(f"--coach {cfg.coach}: the trainer serves this coach, and no server was started")
        spec = f"llm:{SERVED_NAME}@{url or 'http://127.0.0.1:9/v1'}"
        return coach_from_spec(spec, max_tokens=cfg.coach_max_new_tokens)
    return coach_from_spec(cfg.coach, max_tokens=cfg.coach_max_new_tokens)


def config_record(cfg: TrainConfig) -> dict[str, Any]:
    """A run's ``config.json``: every field; ``reward_information``, what its reward sees
    (:mod:`mappa_envs.coach.information`: ``outcome`` for an outcome-only estimator or no coach, else the coach's);
    ``numerics``, what 'auto' resolved to on this machine (device, the trainer's weights and matmuls, the
    engines' weights); ``sandbox``, where agent code runs (:func:`sandbox_choice`); and ``code_version``, the
    commit that started (or last resumed) the run, ``+dirty`` with uncommitted changes
    (:func:`mappa_envs.sealed.code_version`)."""
    process = process_reward(cfg)
    coach = None if cfg.coach == "none" or not process else run_coach(cfg, describe=True)
    numerics = {
        "device": cfg.resolved_device(),
        "dtype": cfg.resolved_dtype(),
        "autocast": cfg.resolved_autocast() or "off",
        "engine_dtype": cfg.resolved_engine_dtype(),
    }
    return {
        **asdict(cfg),
        "reward_information": reward_information(coach, process),
        "numerics": numerics,
        "sandbox": sandbox_choice(cfg),
        "code_version": code_version(),
    }
