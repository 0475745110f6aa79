"""``mappa bench``'s LoRA rows (issue 18): three roles as three full models vs three LoRA adapters on one base, on
SmolLM2-135M with MathChat-length samples, in the single-process trainer's learners (:mod:`baselines.weights.lora`).

- **Trainer memory**: the bytes of every tensor a role set holds after one optimiser step (weights, the reference
  policy, gradients, AdamW's two moments): three full learners keep three models, three reference copies and
  three optimiser states; three LoRA roles keep one base (which is also their reference: adapters disabled) and
  three adapters with their optimiser states. Counted from the tensors themselves (resident memory of one process
  would mix in allocator caches and whatever ran before).
- **Update speed**: tokens per second of one step (forward, backward, AdamW) of one role on the same samples.

Engines (:func:`bench_lora_engines`, each engine in a child process of its own, float32, 1 GiB of KV cache):

- **Engine memory**: the resident memory of one vLLM engine serving three LoRA adapters per request (the three
  adapters loaded and used) against three engines with a full model each (three times one engine's, measured).
- **Weight sync**: the bytes a role's sync sends, its adapter against its full model.
- **Generation speed** with an adapter against the same engine without one (per-request LoRA's cost).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

from baselines.planning.presets import PRESETS
from baselines.ray_learner.engines import VLLMEngine
from baselines.ray_learner.lora_worker import adapter_payload
from baselines.weights.lora import SharedBase
from baselines.weights.models import resolve_model

# torch, transformers and the local trainer are imported inside the functions that use them: the CLI's other commands,
# and --help, load none of them.


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

    from baselines.training.local_trainer import RoleLearner

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


def _rss_gb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024 / 1e9


def _engine_child(path: str, adapters: dict[str, Any] | None, prompts: list[list[int]], tokens: int, q) -> None:
    """In a child process: one engine (with ``adapters`` loaded, if any); its RSS after generating ``prompts``
    under every adapter, and its generation speed with and without the first adapter."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    ranks = {role: a["config"]["r"] for role, a in (adapters or {}).items()}
    engine = VLLMEngine(path, dtype="float32", max_model_len=1024, lora_ranks=ranks or None, name="bench-engine")
    speed = {}
    for role, adapter in (adapters or {}).items():
        engine.load_adapter(role, adapter)
    for name in [None, *ranks]:
        engine.generate(prompts[:1], max_tokens=4, temperature=0.0, adapter=name)  # warm-up
        t = time.perf_counter()
        out = engine.generate(prompts, max_tokens=tokens, temperature=0.0, adapter=name)
        speed[name] = sum(len(o[1]) for o in out) / (time.perf_counter() - t)
    q.put(
        {"rss_gb": _rss_gb(), "base_tok_s": speed[None], "adapter_tok_s": speed[next(iter(ranks))] if ranks else None}
    )
    engine.remove_adapters()


def _in_child(*args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_engine_child, args=(*args, q))
    proc.start()
    try:
        return q.get(timeout=900)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


def bench_lora_engines(n_prompts: int = 8, tokens: int = 64, model: str | None = None) -> list[dict[str, Any]]:
    """The engine rows: one engine with three adapters vs three full engines; sync bytes; LoRA generation speed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model or PRESETS["demo"].model)
    tok = AutoTokenizer.from_pretrained(path)
    roles = ("problem_solver", "code_executor", "verifier")
    shared = SharedBase(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), dict.fromkeys(roles))
    for view in shared.views.values():  # adapters away from their zero start, as after training
        for name, p in view.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    adapters = {r: adapter_payload(shared.peft, r, "float32") for r in roles}
    sync_bytes = sum(a.nbytes for a, _ in adapters[roles[0]]["tensors"].values())
    full_bytes = sum(p.numel() * 4 for n, p in shared.peft.named_parameters() if "lora_" not in n)
    del shared
    prompts = [
        tok(f"Question {i}: what is {i} plus {2 * i}? Answer step by step.")["input_ids"] for i in range(n_prompts)
    ]
    lora = _in_child(path, adapters, prompts, tokens)
    full = _in_child(path, None, prompts, tokens)
    return [
        {
            "figure": "vLLM engine memory, 3 roles: one engine serving 3 LoRA adapters per request (GB RSS)",
            "value": lora["rss_gb"],
            "reference": "3 engines with a full model each (3 x measured)",
            "reference_value": 3 * full["rss_gb"],
            "higher_is_better": False,
        },
        {
            "figure": "weight sync of one role: its LoRA adapter, rank 8 (MB sent)",
            "value": sync_bytes / 1e6,
            "reference": "its full model (MB, float32)",
            "reference_value": full_bytes / 1e6,
            "higher_is_better": False,
        },
        {
            "figure": f"generation with a LoRA adapter, {n_prompts} prompts x {tokens} tokens (tok/s)",
            "value": lora["adapter_tok_s"],
            "reference": "the same engine without an adapter (tok/s)",
            "reference_value": lora["base_tok_s"],
            "higher_is_better": True,
        },
    ]


__all__ = ["bench_lora", "bench_lora_engines"]
