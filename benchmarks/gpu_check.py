"""GPU check of the distributed trainer: two iterations in bf16 on one GPU, with throughput and weight-sync time.

    python benchmarks/gpu_check.py            # ~3-5 minutes on one H200-class GPU, nothing downloaded

What it runs: the Ray trainer (:class:`baselines.ray_trainer.RayTrainer`) on MathChat's arithmetic pool, three roles,
each with its own vLLM engine (``vllm`` extra) and one DeepSpeed ZeRO-3 rank (NCCL), all sharing the one GPU in
equal fractions. The model is a random ~110M-parameter Llama built from a config on the spot (the bundled
tokenizer), so nothing is fetched from a hub; its replies are gibberish, which is fine for throughput: every reply
runs to ``max_new_tokens``.

Prints, per iteration: generated tokens/s (vLLM, all roles together), trained tokens/s per role (forward + backward
+ AdamW step of the update), and the weight-sync seconds (ZeRO-3 gather on rank 0, Ray object store, vLLM
``reload_weights``), then the peak GPU memory Ray's actors reached (from ``nvidia-smi``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def small_model(path: Path) -> str:
    from baselines.models import random_llama

    sizes = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=9)
    return str(random_llama(path, dtype="bfloat16", num_key_value_heads=3, **sizes))


def _iteration_row(m: dict, roles: list[str]) -> dict:
    """The figures of one iteration's metrics this check prints."""
    return {
        "iteration": m["iteration"] + 1,
        "episodes": m["episodes"],
        "gen_tok_s": round(m["gen_tok_s"], 1),
        "rollout_s": round(m["rollout_s"], 1),
        "update_s": round(m["train_s"], 1),
        "sync_s": round(m["sync_s"], 2),
        **{f"train_tok_s[{r}]": round(m.get(r, {}).get("train_tok_s", 0.0), 1) for r in roles},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder (default: a random ~110M Llama built here)")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the GPU path (use `mappa train --preset smoke` on CPU)")
        return 2
    from baselines.config import TrainConfig
    from baselines.ray_trainer import RayTrainer

    work = Path(tempfile.mkdtemp(prefix="mappa-gpu-check-"))
    model = args.model or small_model(work / "model")
    cfg = TrainConfig(
        model=model,
        iterations=args.iterations,
        prompts_per_iteration=args.prompts,
        samples_per_prompt=2,
        concurrency=args.prompts * 2,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=2048,
        micro_batch=8,
        lr=1e-6,
        device="cuda",
        dtype="bfloat16",
        gpu_memory_utilization=0.15,
        truncated="keep",  # the random model's replies all run to max_new_tokens: keep them, to train at all
        out_dir=str(work / "run"),
        progress=False,
        tensorboard=False,
    )
    t0 = time.perf_counter()
    trainer = RayTrainer(cfg)
    print(f"start-up (Ray, 3 vLLM engines, 3 ZeRO-3 ranks): {time.perf_counter() - t0:.1f}s", flush=True)
    try:
        for m in trainer.train():
            print(json.dumps(_iteration_row(m, trainer.roles)), flush=True)
    finally:
        trainer.close()
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    print(f"GPU: {smi.stdout.strip()}")
    print(f"total {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
