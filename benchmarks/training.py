"""``mappa bench``'s training rows (issue 15): the distributed trainer's pieces on the bundled SmolLM2-135M, each
beside a reference measured in the same run.

- :func:`bench_update`: one role's update (the reference log-prob pass and one PPO-clipped AdamW step, as
  :class:`baselines.ray_learner.distributed.RoleWorker` runs it in the demo) on MathChat-length samples (prompts of
  ~450-750 tokens, responses of 128), against a plain PyTorch loop on the same samples (forward with full logits,
  backward, AdamW step) and TRL's ``GRPOTrainer`` training step on the same samples (given through its
  ``rollout_func``, so it generates nothing; ``beta`` = ours, so it runs its reference pass too). Prompt +
  response tokens per second.
- :func:`bench_rollout_and_sync`: three vLLM engines (Ray actors, as the trainer starts them) roll out 16 MathChat
  episodes with 16 envs stepped together and the sandbox on; generated tokens per second against the same engines
  generating the same prompts (every request the rollout sent, each engine's in one batch, all submitted at once,
  prefix cache reset). Then the weight sync of one role, trainer rank -> engine, against copying the same state
  dict in memory; and, where the engines are not float32 (``engine_dtype`` 'auto' on a CPU with AVX512-BF16), the
  rollout's prompts in one raw batch on such an engine against a float32 engine.
- :func:`bench_demo_iteration`: one iteration of issue 15's demo workload (``mappa train --preset demo-arith
  --iterations 1``) with the current settings against the same with the previous demo's (micro-batches of 2 with
  gradient checkpointing, no prefix packs, the trainer's own policy pass): wall seconds per episode.

The rows run on ``demo-arith``, the demo as it was when issue 15 set these figures (the paper's prompts, two- and
three-operation problems: ~600-token prompts), so that they stay comparable across versions of the demo.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mappa_envs
from baselines.algorithm.samples import Sample, prompt_ids, tokenize_samples
from baselines.config import TrainConfig
from baselines.evaluation.rollout import run_episodes
from baselines.planning.presets import PRESETS
from baselines.ray_learner.cluster import ray_init
from baselines.ray_learner.distributed import RoleWorker, plan_shards
from baselines.ray_learner.engines import VLLMEngine, VLLMPolicy
from baselines.weights.models import resolve_model

# torch, transformers and Ray are imported inside the functions that use them: the CLI's other commands, and --help,
# load none of them.

SOLUTION = (
    "Let me solve this step by step. First I find how many items there are in total: I multiply the number of "
    "boxes by the number in each box. Then I subtract the ones given away. I will check it with Python:\n"
    "```python\nboxes = 47\nper_box = 39\ntotal = boxes * per_box\nleft = total - 43\nprint(left)\n```\n"
    "The code prints the answer, so the answer is \\boxed{1790}. "
)


def mathchat_length_samples(tokenizer: Any, prompts: int, per_prompt: int, *, response_tokens: int = 128):
    """``prompts x per_prompt`` samples shaped like the demo's: the MathChat system prompt and task, earlier team
    work padding the context to 450-750 tokens (varying as real turns do), and a ``response_tokens``-token
    response (a cut solution: no EOS)."""
    env = mappa_envs.make("mappa/MathChat-v0", split="arith-train")
    words = SOLUTION.split()
    text_ids = tokenizer(SOLUTION * 6, add_special_tokens=False)["input_ids"]
    out = []
    for p in range(prompts):
        env.reset(seed=p, options={"task_index": p})
        base = env.unwrapped.messages(env.agent_selection)
        target = 450 + (300 * p) // max(1, prompts - 1)
        work, n = [], 0
        messages = base
        while True:  # earlier agents' work, a word at a time, up to the target length
            work.append(words[n % len(words)])
            n += 1
            if n % 8:
                continue
            messages = [*base, {"role": "assistant", "content": " ".join(work)}, base[-1]]
            if len(prompt_ids(tokenizer, messages)) >= target:
                break
        for k in range(per_prompt):  # each sample of a prompt its own response (a different cut of the text)
            start = 11 * (p * per_prompt + k)
            response = text_ids[start : start + response_tokens]
            sample = Sample(
                role="code_executor",
                agent="code_executor_0",
                episode_id=f"e{p}-{k}",
                task_id=f"t{p}",
                action_index=1,
                turn=2,
                messages=messages,
                response=SOLUTION,
                reward=float((p + k) % 2),
                outcome=0.0,
                response_ids=list(response),
                truncated=True,
            )
            out.append(sample)
    env.close()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _our_update(cfg: Any, path: str, samples: list, adv: list, n_resp: int) -> tuple[float, float, dict]:
    """Our role worker on ``samples``: the reference pass (as after a role's first step) and one step, old log-probs
    from its own pass, after a warm-up; returns (reference pass s, step s, the step's stats)."""
    import torch

    worker = RoleWorker("code_executor", 0, 1, _free_port(), path, cfg)
    _, n_micro = plan_shards(worker._rows(samples), 1, cfg)  # the demo's passes: prefix packs (a prompt's samples)
    short = samples[:1]
    zero = [torch.zeros(len(short[0].response_ids))]
    worker.logprobs(short, 1)  # warm-up: first-call allocations, and AdamW's states (a step on zero advantages:
    worker.train_step(short, zero, None, len(zero[0]), 1, 1e-6)  # zero gradients, Adam moves nothing)
    t = time.perf_counter()
    ref = worker.logprobs(samples, n_micro, policy=False, ref=True)
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    stats = worker.train_step(samples, adv, None, n_resp, n_micro, 1e-6, behaviour_logp=[r for _, r in ref])
    return t_ref, time.perf_counter() - t, stats


def _plain_update(cfg: Any, path: str, tok: Any, samples: list, adv: list, n_resp: int) -> float:
    """A plain PyTorch loop on the same samples: padded micro-batches, full logits, backward, AdamW (warmed up the
    same way); returns the step's seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=cfg.betas, weight_decay=0.0)

    def plain_step(batch: list, advantages: list) -> None:
        for i in range(0, len(batch), cfg.micro_batch):
            b = tokenize_samples(batch[i : i + cfg.micro_batch], tok, cfg.max_prompt_tokens, cfg.max_new_tokens + 1)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1].float()
            logp = torch.log_softmax(logits / cfg.temperature, -1)
            logp = torch.gather(logp, 2, b.input_ids[:, 1:, None]).squeeze(2)
            a = torch.zeros_like(logp)
            a[b.response_mask.bool()] = torch.cat(advantages[i : i + cfg.micro_batch])
            (-(logp * a * b.response_mask).sum() / n_resp).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad()

    plain_step(samples[:1], [torch.zeros(len(samples[0].response_ids))])
    t = time.perf_counter()
    plain_step(samples, adv)
    return time.perf_counter() - t


# ---------------------------------------------------------------------------------------------- update
def bench_update(prompts: int = 8, per_prompt: int = 2) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoTokenizer

    from .trl_reference import trl_step_seconds

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    cfg = PRESETS["demo-arith"]
    path = resolve_model(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    samples = mathchat_length_samples(tok, prompts, per_prompt, response_tokens=cfg.max_new_tokens)
    n_prompt = sum(min(len(prompt_ids(tok, s.messages)), cfg.max_prompt_tokens) for s in samples)
    n_resp = sum(len(s.response_ids) for s in samples)
    tokens = n_prompt + n_resp
    shape = f"{len(samples)} samples, {n_prompt // len(samples)}+{n_resp // len(samples)} tokens"
    adv = [torch.full((len(s.response_ids),), 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]

    t_ref, step_s, stats = _our_update(cfg, path, samples, adv, n_resp)
    plain_s = _plain_update(cfg, path, tok, samples, adv, n_resp)
    detail = {
        "reference_pass_s": t_ref,
        "step_s": step_s,
        "forward_backward_s": stats["forward_backward_s"],
        "optimizer_s": stats["optimizer_s"],
        "plain_s": plain_s,
        "tokens": tokens,
    }
    rows = [
        {
            "figure": f"update step (fwd+bwd+AdamW), SmolLM2-135M, one role, {shape} (tok/s)",
            "value": tokens / step_s,
            "reference": "plain PyTorch loop: fwd+bwd+AdamW (tok/s)",
            "reference_value": tokens / plain_s,
            "higher_is_better": True,
            "detail": detail,
        },
        {
            "figure": f"reference pass + update step, same samples (tok/s; plain loop has no reference: "
            f"{tokens / plain_s:.0f})",
            "value": tokens / (t_ref + step_s),
            "reference": "TRL GRPOTrainer step, beta as ours (tok/s)",
            "higher_is_better": True,
        },
    ]
    try:
        rows[1]["reference_value"] = tokens / trl_step_seconds(path, tok, samples, cfg, per_prompt)
    except ImportError as e:
        rows[1]["reference_skipped"] = f"TRL not installed ({e}): pip install 'mappa-envs[bench]'"
    except Exception as e:  # TRL's API moves: keep our figures and say why its reference is missing
        rows[1]["reference_skipped"] = f"TRL's step failed: {type(e).__name__}: {str(e)[:200]}"
    return rows


# ---------------------------------------------------------------------------------------------- rollout, sync
def bench_rollout_and_sync(episodes: int = 16, concurrent: bool = False) -> list[dict[str, Any]]:
    import ray
    from transformers import AutoTokenizer

    cfg: TrainConfig = PRESETS["demo-arith"]
    path = resolve_model(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    ray_init(cfg)
    probe = mappa_envs.make(cfg.env_id, **cfg.env_kwargs)
    roles = [r.name for r in probe.unwrapped.roles]
    sandbox = probe.unwrapped.sandbox_backend
    probe.close()
    Engine = ray.remote(VLLMEngine).options(num_cpus=0)
    length = cfg.max_prompt_tokens + cfg.max_new_tokens
    dtype = cfg.resolved_engine_dtype()
    engines = {
        role: Engine.remote(path, dtype=dtype, seed=i, max_model_len=length, kv_cache_gb=cfg.engine_kv_cache_gb)
        for i, role in enumerate(roles)
    }
    ray.get([e.ready.remote() for e in engines.values()])
    sent: dict[str, list[list[int]]] = {role: [] for role in roles}
    rows = [_rollout_row(cfg, engines, tok, episodes, concurrent, sandbox, sent)]
    worker = ray.remote(RoleWorker).options(num_cpus=0).remote(roles[0], 0, 1, _free_port(), path, cfg)
    rows.append(_sync_row(worker, engines[roles[0]], path, dtype))
    ray.kill(worker)
    if dtype != "float32":  # the engines' dtype against float32 engines, on the rollout's prompts
        [ray.kill(engines.pop(role)) for role in roles[1:]]
        f32 = Engine.remote(path, dtype="float32", seed=0, max_model_len=length, kv_cache_gb=cfg.engine_kv_cache_gb)
        rows.append(_dtype_row(engines[roles[0]], f32, dtype, [p for v in sent.values() for p in v], cfg))
        ray.kill(f32)
    for e in engines.values():
        ray.kill(e)
    ray.shutdown()
    return rows


def _dtype_row(engine: Any, f32: Any, dtype: str, prompts: list[list[int]], cfg: Any) -> dict[str, Any]:
    """The rollout's prompts as one raw batch on an engine of ``dtype`` and on a float32 engine (one at a time)."""
    import ray

    kwargs, out = {"max_tokens": cfg.max_new_tokens, "temperature": cfg.temperature}, {}
    ray.get(f32.ready.remote())
    for name, e in ((dtype, engine), ("float32", f32)):
        ray.get(e.reset_prefix_cache.remote())
        t = time.perf_counter()
        replies = ray.get(e.generate.remote(prompts, **kwargs))
        out[name] = sum(len(r[1]) for r in replies) / (time.perf_counter() - t)
    figure = f"generation, {len(prompts)} rollout prompts in one batch, {dtype} engine (tok/s)"
    reference = "the same prompts on a float32 engine (tok/s)"
    return {
        "figure": figure,
        "value": out[dtype],
        "reference": reference,
        "reference_value": out["float32"],
        "higher_is_better": True,
    }


def _rollout_row(
    cfg: Any,
    engines: dict[str, Any],
    tok: Any,
    episodes: int,
    concurrent: bool,
    sandbox: str,
    sent: dict[str, list[list[int]]],
) -> dict:
    """Full MathChat rollouts on the engines (every prompt recorded in ``sent``), then the same prompts as raw
    batches."""
    roles = list(engines)

    class Recording(VLLMPolicy):
        def __init__(self, role: str):
            super().__init__(
                engines[role],
                tok,
                max_prompt_tokens=cfg.max_prompt_tokens,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                concurrent=concurrent,
            )
            self.role = role

        def encode(self, conversation):
            ids = super().encode(conversation)
            sent[self.role].append(ids)
            return ids

    policies = {role: Recording(role) for role in roles}
    warm = VLLMPolicy(engines[roles[0]], tok, max_prompt_tokens=64, max_new_tokens=4, temperature=cfg.temperature)
    warm.generate([[{"role": "user", "content": "hi"}]])
    timings: dict[str, float] = {}
    t = time.perf_counter()
    records = run_episodes(
        lambda: mappa_envs.make(cfg.env_id, **cfg.env_kwargs),
        policies,
        episodes,
        seed=0,
        concurrency=episodes,
        reset_options=lambda i: {"task_index": i},
        timings=timings,
    )
    rollout_s = time.perf_counter() - t
    rollout_tokens = sum(p.generated_tokens for p in policies.values())
    raw, best = _raw_batches(engines, sent, cfg)
    raw_tokens, raw_s = raw[best]
    actions = sum(len(r.actions) for r in records)
    return {
        "figure": f"rollout: {episodes} MathChat episodes, 16 envs, 3 engines, sandbox {sandbox} (gen tok/s)",
        "value": rollout_tokens / rollout_s,
        "reference": "same engines and prompts, a raw batch each (tok/s)",
        "reference_value": raw_tokens / raw_s,
        "higher_is_better": True,
        "detail": {
            "rollout_s": rollout_s,
            "raw_s": raw_s,
            "actions": actions,
            "requests": sum(len(v) for v in sent.values()),
            "raw_tok_s": {k: n / sec for k, (n, sec) in raw.items()},
            **timings,
            "reference_is": best,
        },
    }


def _raw_batches(engines: dict[str, Any], sent: dict[str, list[list[int]]], cfg: Any):
    """The rollout's prompts as raw batches: every engine's at once (as the rollout submits them), and one engine
    after the other (on a CPU the engines share the cores): {how: (tokens, seconds)} and the faster of the two."""
    import ray

    kwargs = {"max_tokens": cfg.max_new_tokens, "temperature": cfg.temperature}
    raw = {}
    for how in ("together", "one after the other"):
        ray.get([e.reset_prefix_cache.remote() for e in engines.values()])
        t = time.perf_counter()
        if how == "together":
            got = ray.get([engines[r].generate.remote(sent[r], **kwargs) for r in engines if sent[r]])
        else:
            got = [ray.get(engines[r].generate.remote(sent[r], **kwargs)) for r in engines if sent[r]]
        raw[how] = (sum(len(x[1]) for replies in got for x in replies), time.perf_counter() - t)
    return raw, max(raw, key=lambda k: raw[k][0] / raw[k][1])


def _sync_row(worker: Any, engine: Any, path: str, dtype: str) -> dict[str, Any]:
    """The weight sync of one role, a trainer rank (the demo's, ZeRO stage 0) -> its engine (weights in ``dtype``),
    3 times, against copying the same state dict in memory."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    ray.get(worker.ready.remote())
    secs, loads = [], []
    for _ in range(3):
        t = time.perf_counter()
        loads.append(ray.get(engine.load_weights.remote(worker.engine_weights.remote())))
        secs.append(time.perf_counter() - t)
    state = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    copies = []
    for _ in range(3):
        t = time.perf_counter()
        copy = {k: v.clone() for k, v in state.items()}
        copies.append(time.perf_counter() - t)
        del copy
    return {
        "figure": f"weight sync, one role, trainer rank -> {dtype} vLLM engine (s, median of 3)",
        "value": statistics.median(secs),
        "reference": "copying the same state dict in memory (s)",
        "reference_value": statistics.median(copies),
        "detail": {"sync_s": secs, "engine_load_s": loads, "copy_s": copies},
    }


# ---------------------------------------------------------------------------------------------- demo iteration
PREVIOUS_DEMO = [
    *("--micro-batch", "2", "--pack-tokens", "0", "--engine-dtype", "float32"),
    *("--gradient-checkpointing", "--no-rollout-logprobs", "--concurrent-generation"),
]
"""The previous demo's settings (micro-batches of 2 with gradient checkpointing, the trainer's own policy pass,
every role's engine generating at once, float32 engines). The smaller changes made with them are not switchable
(micro-batches in length order, fused AdamW, no all-reduce with one rank, weights as numpy arrays): the reference is
the previous settings on today's code, so it is faster than the previous code was."""


def bench_demo_iteration() -> dict[str, Any]:
    def run(extra: list[str]) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["train", "--preset", "demo-arith", "--iterations", "1", "--eval-episodes", "0", "--no-progress"]
            cmd = [sys.executable, "-m", "benchmarks.cli", *argv, "--out", tmp, *extra]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(cmd[2:])} exited {done.returncode}: {done.stderr[-400:]}")
            m = json.loads((Path(tmp) / "metrics.jsonl").read_text().splitlines()[0])
            return float(m["iteration_s"]) / m["episodes"]

    ours = run([])
    previous = run(PREVIOUS_DEMO)
    return {
        "figure": "demo iteration, wall time per episode (s)",
        "value": ours,
        "reference": "the same with the previous demo's settings (s)",
        "reference_value": previous,
    }
