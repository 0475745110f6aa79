"""GPU check of the distributed trainer: two iterations in bf16 on one GPU, with throughput and weight-sync time.

    python benchmarks/gpu_check.py            # ~3-5 minutes on one H200-class GPU, nothing downloaded
    python benchmarks/gpu_check.py --out FILE # the result file (default: runs/gpu-check-<time>.json)

What it runs: the Ray trainer (:class:`baselines.training.ray_trainer.RayTrainer`) on MathChat's arithmetic pool, three
roles, each with its own vLLM engine (``vllm`` extra) and one DeepSpeed ZeRO-3 rank (NCCL), all sharing the one GPU in
equal fractions. The model is a random ~110M-parameter Llama built from a config on the spot (the bundled
tokenizer), so nothing is fetched from a hub; its replies are gibberish, which is fine for throughput: every reply
runs to ``max_new_tokens``.

Prints, per iteration: generated tokens/s (vLLM, all roles together), trained tokens/s per role (forward + backward
+ AdamW step of the update), and the weight-sync seconds (ZeRO-3 gather on rank 0, Ray object store, vLLM
``reload_weights``), then the GPU memory in use at the end (from ``nvidia-smi``).

Writes a result file (:func:`check_record`) with provenance: the command, the commit, the hardware, the
configuration, each iteration's figures, ``nvidia-smi``'s view, and, when it fails, the error and its traceback. That
file (and the run's ``logs/`` folder, named in it) is what to send back: docs/training.md, "The first GPU run".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig
from baselines.evaluation.protocol import hardware
from baselines.weights.models import random_llama
from mappa_envs.sealed import code_version

# torch and the Ray trainer are imported inside the functions that use them: the CLI's other commands, and --help, load
# none of them.

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def small_model(path: Path) -> str:
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


SCHEMA = "mappa-gpu-check/1"


def check_record(
    argv: Sequence[str],
    cfg: Any,
    rows: Sequence[dict],
    *,
    startup_s: float | None,
    total_s: float,
    gpu: str,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """The result file's content: ``status`` ``ok`` or ``failed`` (with the error and its traceback), provenance
    (command, commit, hardware, time), the configuration and each iteration's figures (:func:`_iteration_row`)."""
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "status": "ok" if error is None else "failed",
        "command": " ".join(["python", "benchmarks/gpu_check.py", *argv]),
        "code_version": code_version(),
        "hardware": hardware(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # as JSON holds it (tuples as lists), so the record is the file
        "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
        "startup_s": None if startup_s is None else round(startup_s, 1),
        "total_s": round(total_s, 1),
        "iterations": list(rows),
        "nvidia_smi": gpu,
        "logs": str(Path(cfg.out_dir) / "logs"),
    }
    if error is not None:
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = "".join(traceback.format_exception(error))
    return record


def _nvidia_smi() -> str:
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    return smi.stdout.strip() or smi.stderr.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder (default: a random ~110M Llama built here)")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument(
        "--out", default=None, help="the result file (default: runs/gpu-check-<time>.json; the run's folder beside it)"
    )
    args = ap.parse_args()
    out = Path(args.out or f"runs/gpu-check-{time.strftime('%Y%m%d-%H%M%S')}.json")

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the GPU path (use `mappa train --preset smoke` on CPU)")
        return 2
    from baselines.training.ray_trainer import RayTrainer

    work = Path(tempfile.mkdtemp(prefix="mappa-gpu-check-"))  # the random model, built here
    model = args.model or small_model(work / "model")
    run_dir = out.parent / out.stem  # beside the result file: its logs/ folder is the other thing to send back
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
        out_dir=str(run_dir),
        progress=False,
        tensorboard=False,
    )
    t0 = time.perf_counter()
    rows: list[dict] = []
    startup_s: float | None = None
    error: BaseException | None = None
    try:
        trainer = RayTrainer(cfg)
        startup_s = time.perf_counter() - t0
        print(f"start-up (Ray, 3 vLLM engines, 3 ZeRO-3 ranks): {startup_s:.1f}s", flush=True)
        try:
            for m in trainer.train():
                rows.append(_iteration_row(m, trainer.roles))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            trainer.close()
    except Exception as e:  # recorded in the result file, then raised: a failed check is what to send back
        error = e
    gpu = _nvidia_smi()
    total = time.perf_counter() - t0
    record = check_record(sys.argv[1:], cfg, rows, startup_s=startup_s, total_s=total, gpu=gpu, error=error)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"GPU: {gpu}")
    print(f"total {total:.1f}s; result file: {out} ({record['status']})")
    if error is not None:
        raise error
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
