"""The vLLM side of the distributed trainer: an engine per role (:class:`VLLMEngine`, a Ray actor or in-process),
the driver-side :class:`VLLMPolicy` that batches a role's conversations onto it, and the weight transfer from a
trainer rank to an engine (:func:`pack_weights` / :func:`unpack_weights`: numpy arrays that cross Ray's object
store without a copy).

Nothing here imports Ray or vLLM at module level.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from baselines.algorithm.samples import prompt_ids
from baselines.runs.console import redirect_actor_output
from baselines.weights.policies import Generation

# ----------------------------------------------------------------------------------------------- weight transfer


def pack_weights(state: dict[str, Any], dtype: str | None = None) -> dict[str, tuple[Any, str]]:
    """A state dict as numpy arrays (with each tensor's dtype name), for Ray's object store: Ray writes numpy
    arrays into shared memory out of band, once, and a reader on the same node maps them without a copy, where a
    pickled torch tensor is copied in and out of the pickle. bfloat16, which numpy lacks, travels as int16 bits.
    ``dtype`` (a torch dtype name): floating tensors are cast to it first (the engine's dtype: a bfloat16 engine
    gets half the bytes of a float32 trainer's weights). The arrays are views of the tensors where those are
    contiguous CPU tensors already in that dtype: pack right before handing over."""
    import torch

    cast = getattr(torch, dtype) if dtype else None
    out: dict[str, tuple[Any, str]] = {}
    for name, t in state.items():
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if cast is not None and t.is_floating_point() and t.dtype != cast:
            t = t.to(cast)
        t = t.contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        out[name] = ((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy(), dtype)
    return out


def unpack_weights(weights: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(name, tensor)`` pairs from :func:`pack_weights`' arrays (no copy: the tensors share the arrays' memory,
    which may be read-only shared memory; the reader copies them into its own parameters) or from tensors."""
    import torch

    pairs = []
    for name, value in weights.items():
        if isinstance(value, tuple):
            array, dtype = value
            with warnings.catch_warnings():  # a read-only array: the tensor is only read from
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(array)
            if dtype == "bfloat16":
                t = t.view(torch.bfloat16)
            value = t
        pairs.append((name, value))
    return pairs


# ----------------------------------------------------------------------------------------------- vLLM engine

RESET_STEPS = ("weights", "optimizer", "rng")
"""What resetting a pooled actor does (:mod:`baselines.training.pool`): its weights back to the run's starting model,
its optimiser (and step count) rebuilt, its random generators seeded from the run's seed."""


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators in this process."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def lora_rank_slot(ranks: dict[str, int]) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds every adapter's rank."""
    top = max(ranks.values())
    for slot in LORA_RANK_SLOTS:
        if slot >= top:
            return slot
    raise ValueError(f"LoRA rank {top}: vLLM serves ranks up to {LORA_RANK_SLOTS[-1]}")


def starting_weights(model_path: str) -> list[tuple[str, Any]]:
    """A model folder's weights by Hugging Face name, the output head included where the embedding is tied to it
    (the trainer sends it so, :meth:`~baselines.ray_learner.distributed.RoleWorker.full_state`, and vLLM then holds
    its own copy: reading the folder alone, vLLM's reload would leave the head as the last sync set it)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for file in sorted(Path(model_path).glob("*.safetensors")):
        state.update(load_file(str(file)))
    if not state:
        raise FileNotFoundError(f"no *.safetensors weights in {model_path}")
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return list(state.items())


class VLLMEngine:
    """One role's generation engine: a vLLM ``LLM`` in this process (V1 engine core in-process), whose weights
    the role's trainer replaces after every update through ``collective_rpc("reload_weights")``."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        max_model_len: int = 2048,
        kv_cache_gb: float = 1.0,
        gpu_memory_utilization: float = 0.25,
        name: str = "engine",
        lora_ranks: dict[str, int] | None = None,
    ):
        redirect_actor_output(os.environ.get("MAPPA_ACTOR_LOG_DIR"), name)  # `name` names the log file
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the actor is the process; no engine-core child
        if device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gb))))
        from vllm import LLM

        kwargs: dict[str, Any] = {}
        if device == "cuda":
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if lora_ranks:  # one base, an adapter per LoRA role, chosen per request
            kwargs.update(enable_lora=True, max_loras=len(lora_ranks), max_lora_rank=lora_rank_slot(lora_ranks))
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=device == "cpu",
            enable_prefix_caching=True,  # every turn of an episode re-sends the team's context
            # the sampled tokens' log-probs after temperature (what the trainer's policy pass would compute, and
            # what the KL penalty needs), not vLLM's default of the raw logits' log-probs
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        self.max_model_len = max_model_len
        self.model_path, self.name = model_path, name
        self.weight_version = 0
        self.changed = False
        """Weights loaded since the model was read from disk (what :meth:`reset` undoes, with the adapters)."""
        self.adapters: dict[str, Any] = {}  # role -> the LoRARequest of its latest adapter
        self._adapter_dir: str | None = None

    def ready(self) -> str:
        """The id of the node this actor runs on, once it is up."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        """This actor's process id (the pool's memory figure)."""
        return os.getpid()

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        logprobs: bool = True,
        adapter: str | None = None,
    ) -> list[tuple[str, list[int], str, list[float] | None]]:
        """Replies ``(text, sampled token ids, finish reason, log-probs)`` for token-id prompts, in order. The ids
        include the end-of-sequence token when generation stopped on it; the reason is ``"stop"`` or ``"length"``;
        the log-probs (``logprobs=True``) are each sampled token's under the engine's weights at ``temperature``
        (after top-p), else None. ``adapter``: the LoRA role whose adapter serves these prompts (:meth:`load_adapter`).
        """
        from vllm import SamplingParams

        params = SamplingParams(
            temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0 if logprobs else None
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, **self._lora(adapter)
        )
        replies = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = None
            if logprobs:
                if c.logprobs is None or len(c.logprobs) != len(ids):
                    raise RuntimeError(
                        f"vLLM returned {0 if c.logprobs is None else len(c.logprobs)} log-probs for {len(ids)} tokens"
                    )
                lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, ids, strict=True)]
            replies.append((c.text, ids, c.finish_reason or "length", lps))
        return replies

    def load_weights(self, weights: dict[str, Any]) -> float:
        """Replace the model's weights (full, unsharded tensors by Hugging Face name, or :func:`pack_weights`'
        arrays); returns seconds taken."""
        t0 = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": unpack_weights(weights)})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.weight_version += 1
        self.changed = True
        return time.perf_counter() - t0

    def reset(
        self, seed: int, *, steps: tuple[str, ...] = RESET_STEPS, log_dir: str | None = None, name: str | None = None
    ) -> float:
        """Make this engine as a fresh one started with ``seed`` (a pooled engine's next run:
        :mod:`baselines.training.pool`; every run's engines, fresh ones too, so that both start from the same state):
        ``weights``: the model read again from disk and every adapter dropped; the prefix cache cleared; ``rng``:
        Python's, numpy's and torch's generators seeded (vLLM samples from torch's). Its output goes to
        ``log_dir/<name>.log``. ``steps`` leaves steps out only to show that each is needed (the pool's test).
        Returns seconds taken."""
        t0 = time.perf_counter()
        redirect_actor_output(log_dir, name or self.name)
        if "weights" in steps:
            if self.changed:
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": starting_weights(self.model_path)}
                )
            for request in self.adapters.values():
                self.llm.llm_engine.remove_lora(request.lora_int_id)
                shutil.rmtree(request.lora_path, ignore_errors=True)
            self.adapters.clear()
            self.changed = False
        self.llm.reset_prefix_cache()
        if "rng" in steps:
            seed_everything(seed)
        return time.perf_counter() - t0

    def _lora(self, adapter: str | None) -> dict[str, Any]:
        """``generate``'s argument for ``adapter``'s latest weights; none (the base) for no adapter or for one never
        loaded: a
        LoRA role's adapter starts as the identity (peft initialises ``lora_B`` to zeros), so before its first step
        the base *is* its policy."""
        request = self.adapters.get(adapter) if adapter else None
        return {"lora_request": request} if request is not None else {}

    def load_adapter(self, role: str, adapter: dict[str, Any]) -> float:
        """Serve ``role``'s requests with a new adapter (``{"config": peft's adapter_config, "tensors":``
        :func:`pack_weights` ``' arrays}``, what :meth:`baselines.ray_learner.lora_worker.LoraWorker.engine_weights`
        sends): it is written as a peft folder under a new name and id (vLLM's prefix cache keys blocks by the adapter's
        path, so no stale block is reused), and the role's previous adapter is removed. Returns seconds taken."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        if self._adapter_dir is None:
            self._adapter_dir = tempfile.mkdtemp(prefix="mappa-adapters-")
        self.weight_version += 1
        folder = Path(self._adapter_dir) / f"{role}-v{self.weight_version}"
        folder.mkdir()
        tensors = {name: t.clone() for name, t in unpack_weights(adapter["tensors"])}  # shared memory is read-only
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(adapter["config"]))
        old = self.adapters.get(role)
        self.adapters[role] = LoRARequest(folder.name, self.weight_version, str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return time.perf_counter() - t0

    def remove_adapters(self) -> int:
        """Delete the adapter folders on disk (before the engine is killed); returns how many there were."""
        n = len(self.adapters)
        if self._adapter_dir:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
        return n

    def reset_prefix_cache(self) -> bool:
        """Forget the cached KV blocks (a benchmark's cold start; a weight load does it too)."""
        return bool(self.llm.reset_prefix_cache())

    def prompt_logprobs(self, prompt: list[int], adapter: str | None = None) -> list[float]:
        """Log-probability of each token of ``prompt`` after the first under the engine's current weights (with
        ``adapter``'s LoRA adapter)."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        out = self.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False, **self._lora(adapter))[0]
        return [out.prompt_logprobs[i][tok].logprob for i, tok in enumerate(prompt) if i > 0]


class VLLMPolicy:
    """A :class:`baselines.weights.policies.Policy` backed by a :class:`VLLMEngine` (a Ray actor, or an instance in this
    process): chat template and prompt truncation here, generation in the engine. ``submit`` lets rollouts keep
    every role's engine busy at once; ``concurrent=False`` makes it wait for its engine instead (engines sharing
    the same CPU cores: one at a time is faster)."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        max_prompt_tokens: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        concurrent: bool = True,
        adapter: str | None = None,
    ):
        self.engine, self.tokenizer = engine, tokenizer
        self.adapter = adapter  # a LoRA role's name: its adapter on the engine's base
        self.concurrent = concurrent
        self.max_prompt_tokens, self.max_new_tokens = max_prompt_tokens, max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.generated_tokens = 0
        self.truncated_prompts = 0

    def encode(self, conversation) -> list[int]:
        ids = prompt_ids(self.tokenizer, conversation)
        if len(ids) > self.max_prompt_tokens:  # keep the end: the latest instruction and tool feedback
            self.truncated_prompts += 1
            ids = ids[-self.max_prompt_tokens :]
        return ids

    def submit(self, batch):
        prompts = [self.encode(c) for c in batch]
        kwargs = {"max_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p}
        if self.adapter:
            kwargs["adapter"] = self.adapter
        generate = self.engine.generate
        if not hasattr(generate, "remote"):  # an engine in this process (``mappa eval``)
            replies = generate(prompts, **kwargs)
            return lambda: self._texts(replies)
        import ray

        ref = generate.remote(prompts, **kwargs)
        if not self.concurrent:  # this engine finishes before the caller submits to another one
            replies = ray.get(ref)
            return lambda: self._texts(replies)
        return lambda: self._texts(ray.get(ref))

    def _texts(self, replies: list[tuple[str, list[int], str, list[float] | None]]) -> list[Generation]:
        self.generated_tokens += sum(len(r[1]) for r in replies)
        return [Generation(*r) for r in replies]

    def generate(self, batch) -> list[Generation]:
        return self.submit(batch)()
