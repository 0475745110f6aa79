"""``mappa bench``: the speed and memory suite. Every figure is printed with a reference measured in the same run.
(Not the mappa-bench-v2 benchmark of methods, which ``mappa eval --protocol`` runs: docs/benchmarking.md.)

    mappa bench [--quick] [--json out.json] [--skip generation trainer ...]

1. env: ``env.step`` of MathChat with a scripted policy and no code (median), against the step of a minimal
   pure-Python three-agent AEC env (the floor of any PettingZoo turn-taking env).
2. sandbox: ``print(1)`` per backend and mode (median), against a bare ``python -I -c 'print(1)'`` subprocess.
3. coach: 8 episodes scored by a coach that answers in 0.5 s, blocking calls against the shared pool.
4. generation: the in-process vLLM engine against transformers ``generate``, same model (the bundled
   SmolLM2-135M), same 8 prompts, 64 new tokens each, greedy: generated tokens per second.
5. trainer: one generate-and-update step of 8 prompts x 2 samples on the tiny random model, our REINFORCE++ role
   learner (transformers ``generate`` + :class:`baselines.training.local_trainer.RoleLearner`) against TRL's
   ``GRPOTrainer`` on the same model, prompts, completion length and batch: prompt + completion tokens per second
   (mostly per-step overheads: the model is tiny).
6. update, 7. rollout (and weight sync), 8. demo: the distributed trainer on the bundled SmolLM2-135M
   (:mod:`benchmarks.training`): one role's update against a plain PyTorch loop and TRL's GRPOTrainer step on the
   same MathChat-length samples; rollout generation against the same prompts in one raw batch; a role's weight
   sync against an in-memory copy; one demo iteration per episode against the previous demo settings.
9. start: a run of the distributed trainer (smoke preset) starting on a warm actor pool against its cold start
   (:mod:`benchmarks.pool_bench`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from baselines.algorithm.samples import Sample, prompt_ids
from baselines.config import TrainConfig
from baselines.ray_learner.engines import VLLMEngine
from baselines.weights.models import resolve_model, tiny_model_dir
from baselines.weights.policies import GenerationConfig, TransformersPolicy
from benchmarks.coach_throughput import overlap
from benchmarks.commands.common import add_ray_address, use_ray_address
from benchmarks.env_overhead import time_steps
from benchmarks.trl_reference import train_step_seconds
from sandboxes import Limits, make_sandbox

# torch, transformers, datasets, TRL and the trainers are imported inside the functions that use them: the CLI's other
# commands, and --help, load none of them.

SECTIONS = ("env", "sandbox", "coach", "generation", "trainer", "update", "lora", "rollout", "start", "demo")


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


# ---------------------------------------------------------------------------------------------- 1. env
class _FloorEnv:
    """The least an AEC turn-taking env does: pick the next agent, store the action, hand out rewards."""

    def __init__(self) -> None:
        self.agents = ["a_0", "b_0", "c_0"]
        self.reset()

    def reset(self) -> None:
        self.i, self.history = 0, []
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.agent_selection = self.agents[0]

    def step(self, action: str) -> None:
        self.history.append((self.agent_selection, action))
        self.i += 1
        self.agent_selection = self.agents[self.i % 3]
        if self.i % 3 == 0:
            self.rewards = dict.fromkeys(self.agents, 1.0)


def bench_env(episodes: int) -> dict[str, Any]:
    steps, _ = time_steps(episodes, with_code=False)
    floor = _FloorEnv()
    xs = []
    for _ in range(len(steps)):
        t = time.perf_counter()
        floor.step("I will not run code.")
        xs.append(time.perf_counter() - t)
    return {
        "figure": "MathChat env.step, scripted text action (ms, median)",
        "value": _median_ms(steps),
        "reference": "step of a minimal 3-agent AEC env",
        "reference_value": _median_ms(xs),
    }


# ---------------------------------------------------------------------------------------------- 2. sandbox
def bench_sandbox(repeat: int) -> list[dict[str, Any]]:
    bare = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-c", "print(1)"], capture_output=True, check=True)
        bare.append(time.perf_counter() - t)
    rows = []
    for backend in ("subprocess", "bubblewrap", "docker"):
        for mode in ("fresh", "warm"):
            try:
                sandbox = make_sandbox(backend, limits=Limits(timeout_s=60, memory_mb=2048), mode=mode)
            except Exception as e:
                rows.append({"figure": f"sandbox {backend}/{mode} print(1)", "skipped": f"{type(e).__name__}: {e}"})
                break
            with sandbox.session() as s:
                s.run("print(1)")
                xs = []
                for _ in range(repeat):
                    t = time.perf_counter()
                    r = s.run("print(1)")
                    xs.append(time.perf_counter() - t)
                    if not r.ok:
                        raise RuntimeError(f"{backend}/{mode}: {r.status} {r.stderr[-300:]}")
            sandbox.close()
            rows.append(
                {
                    "figure": f"sandbox {backend}/{mode} print(1) (ms, median)",
                    "value": _median_ms(xs),
                    "reference": "bare `python -I -c print(1)`",
                    "reference_value": _median_ms(bare),
                }
            )
    return rows


# ---------------------------------------------------------------------------------------------- 3. coach
def bench_coach(episodes: int) -> dict[str, Any]:
    blocking, pooled = overlap(latency=0.5, episodes=episodes)
    return {
        "figure": f"coach: {episodes} episodes, 0.5 s per coach call, shared pool (s)",
        "value": pooled,
        "reference": "blocking coach calls",
        "reference_value": blocking,
    }


# ---------------------------------------------------------------------------------------------- 4. generation
PROMPTS = [
    [{"role": "user", "content": f"Write a short Python function that returns the {n}th Fibonacci number."}]
    for n in range(3, 11)
]


def bench_generation(new_tokens: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    ids = [prompt_ids(tok, p) for p in PROMPTS]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(x) for x in ids)
    batch = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=batch,
            attention_mask=attn,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    hf_s = time.perf_counter() - t
    hf_tokens = int((out[:, width:] != pad).sum()) or out[:, width:].numel()
    del model
    engine = VLLMEngine(path, max_model_len=1024)
    engine.generate(ids[:1], max_tokens=4, temperature=0.0)  # warm-up
    t = time.perf_counter()
    replies = engine.generate(ids, max_tokens=new_tokens, temperature=0.0)
    vllm_s = time.perf_counter() - t
    vllm_tokens = sum(len(r[1]) for r in replies)
    return {
        "figure": f"generation, SmolLM2-135M, {len(ids)} prompts x {new_tokens} tokens: vLLM engine (tok/s)",
        "value": vllm_tokens / vllm_s,
        "reference": "transformers generate (tok/s)",
        "reference_value": hf_tokens / hf_s,
        "higher_is_better": True,
    }


# ---------------------------------------------------------------------------------------------- 5. trainer
def bench_trainer(completion: int = 32) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from baselines.training.local_trainer import RoleLearner

    path = str(tiny_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [p for p in PROMPTS for _ in range(2)]  # 8 prompts x 2 samples
    cfg = TrainConfig(model=path, estimator="grpo", lr=1e-5, micro_batch=16, max_new_tokens=completion)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    learner = RoleLearner(model, tok, cfg)
    policy = TransformersPolicy.from_model(model, tok, GenerationConfig(max_new_tokens=completion, temperature=1.0))
    t = time.perf_counter()
    replies = policy.generate(prompts)
    samples = [
        Sample("r", "r_0", str(i), f"p{i // 2}", 0, 1, p, reply, float(i % 2), 0.0, list(reply.token_ids))
        for i, (p, reply) in enumerate(zip(prompts, replies, strict=True))
    ]
    learner.update(samples)
    ours_s = time.perf_counter() - t
    tokens = sum(len(prompt_ids(tok, p)) for p in prompts) + sum(len(r.token_ids) for r in replies)
    row = {
        "figure": f"trainer step, tiny model, {len(prompts)} samples x {completion} tokens: REINFORCE++ (tok/s)",
        "value": tokens / ours_s,
        "reference": "TRL GRPOTrainer, same model, prompts and batch (tok/s)",
        "higher_is_better": True,
    }
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        row["reference_skipped"] = f"TRL not installed ({e}): pip install 'mappa-envs[bench]'"
        return row
    row["reference_value"] = tokens / _trl_tiny_step_seconds(path, tok, prompts, completion)
    return row


def _trl_tiny_step_seconds(path: str, tok: Any, prompts: list, completion: int) -> float:
    """TRL's GRPOTrainer on the tiny model, same prompts, batch and rewards as :func:`bench_trainer`: the seconds of
    its second step (no first-call overheads)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=len(prompts),
            num_generations=2,
            max_completion_length=completion,
            max_steps=2,
            learning_rate=1e-5,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            temperature=1.0,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            reward_funcs=lambda completions, **kw: [float(i % 2) for i in range(len(completions))],  # as ours
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS] * 4),
            processing_class=tok,
        )
        return train_step_seconds(trainer)[-1]


def _training():
    from benchmarks import training

    return training


def _pool_bench():
    from benchmarks import pool_bench

    return pool_bench


def _lora():
    from benchmarks import lora_bench

    return lora_bench


# ---------------------------------------------------------------------------------------------- main
def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'figure':<82}{'value':>10}  {'reference':<48}{'value':>10}{'ratio':>8}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['figure']:<82}{'skipped':>10}  {r['skipped'][:60]}")
            continue
        ref = r.get("reference_value")
        ratio = f"{r['value'] / ref:>7.2f}x" if ref else "-"
        refv = f"{ref:>10.2f}" if ref is not None else f"{'n/a':>10}"
        print(f"{r['figure']:<82}{r['value']:>10.2f}  {r['reference']:<48}{refv}{ratio:>8}")
        if "reference_skipped" in r:
            print(f"{'':<82}{'':>10}  ({r['reference_skipped']})")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mappa bench", description=" ".join(__doc__.splitlines()[:2]))
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=SECTIONS,
        metavar="SECTION",
        help="sections to leave out: " + ", ".join(SECTIONS),
    )
    p.add_argument("--json", default=None, metavar="FILE", help="also write every figure to FILE")
    add_ray_address(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    use_ray_address(args.ray_address)  # the rollout section's engines, and the demo section's `mappa train` runs
    n = 5 if args.quick else 20
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    steps = [
        ("env", lambda: [bench_env(20 if args.quick else 100)]),
        ("sandbox", lambda: bench_sandbox(n)),
        ("coach", lambda: [bench_coach(8)]),
        ("generation", lambda: [bench_generation(32 if args.quick else 64)]),
        ("trainer", lambda: [bench_trainer()]),
        ("update", lambda: _training().bench_update(*((4, 2) if args.quick else (8, 2)))),
        ("lora", lambda: _lora().bench_lora(*((2, 2) if args.quick else (4, 2))) + _lora().bench_lora_engines()),
        ("rollout", lambda: _training().bench_rollout_and_sync(8 if args.quick else 16)),
        ("start", lambda: _pool_bench().bench_run_start()),
        ("demo", lambda: [_training().bench_demo_iteration()]),
    ]
    # the demo iterations run in child processes whose memory check counts this process's: before the sections
    # that load models here
    steps.sort(key=lambda step: step[0] != "demo" and step[0] not in ("env", "sandbox", "coach"))
    for name, fn in steps:
        if name in args.skip:
            continue
        t = time.perf_counter()
        try:
            got = fn()
        except Exception as e:  # one section failing must not hide the others' figures
            got = [{"figure": name, "skipped": f"failed: {type(e).__name__}: {e}"}]
        rows += got
        print(f"[bench] {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    _print(rows)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("skipped" in r and r["skipped"].startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
