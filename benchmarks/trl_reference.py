"""The TRL reference of ``mappa bench``'s update figure: TRL's ``GRPOTrainer`` training step on the same samples
(handed to it by ``rollout_func``, nothing generated), timed per optimiser step."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from baselines.algorithm.samples import prompt_ids

# torch, transformers, datasets and TRL are imported inside the functions that use them: the CLI's other commands, and
# --help, load none of them.


def trl_step_seconds(path: str, tok: Any, samples: list, cfg: Any, per_prompt: int) -> float:
    """Seconds of TRL ``GRPOTrainer``'s second optimiser step (the first pays first-call costs) over ``samples``,
    handed to it by ``rollout_func`` (nothing is generated): its reference pass (beta = ours), forward, backward
    and AdamW step, in micro-batches of ``cfg.micro_batch``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    prompts, rollout = _given_rollout(tok, samples, cfg.max_prompt_tokens)
    n = len(samples)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=cfg.micro_batch * per_prompt,
            gradient_accumulation_steps=n // (cfg.micro_batch * per_prompt),
            num_generations=per_prompt,
            max_completion_length=cfg.max_new_tokens,
            max_steps=2,
            learning_rate=1e-6,
            beta=cfg.beta_kl,
            epsilon=cfg.clip_eps,
            temperature=cfg.temperature,
            max_grad_norm=cfg.grad_clip,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            reward_funcs=lambda completions, **kw: [float(i % 2) for i in range(len(completions))],
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts] * 4),
            processing_class=tok,
            rollout_func=rollout,
        )
        times = train_step_seconds(trainer)
    return times[-1]


def _given_rollout(tok: Any, samples: list, max_prompt_tokens: int) -> tuple[list[str], Any]:
    """TRL's prompts (one per task) and a ``rollout_func`` that hands it ``samples`` as if it had generated them."""
    by_prompt: dict[str, list] = {}
    for s in samples:
        by_prompt.setdefault(s.task_id, []).append(s)

    def rollout(batch_prompts, trainer):
        # TRL's sampler repeats each prompt num_generations times: the k-th copy gets the prompt's k-th sample
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        seen: dict[str, int] = {}
        for p in batch_prompts:
            k = seen.get(p, 0)
            seen[p] = k + 1
            s = by_prompt[p][k % len(by_prompt[p])]
            out["prompt_ids"].append(prompt_ids(tok, s.messages)[-max_prompt_tokens:])
            out["completion_ids"].append(list(s.response_ids))
            out["logprobs"].append([0.0] * len(s.response_ids))  # used only with TRL's own vLLM
        return out

    return list(by_prompt), rollout


def train_step_seconds(trainer: Any) -> list[float]:
    """Run a transformers ``Trainer`` (TRL's GRPOTrainer here) and return each optimiser step's wall seconds."""
    from transformers import TrainerCallback

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    trainer.add_callback(StepTimer())
    trainer.train()
    return times
