"""Policies: a batch of chat conversations in, one reply per conversation out.

:class:`Policy`, :class:`Generation` and :class:`ScriptedPolicy` are the env package's
(:mod:`mappa_envs.core.policy`), re-exported here; :class:`TransformersPolicy` runs a local causal LM and
:class:`TransformersChatBackend` makes one a coach's chat backend.

A policy that samples from a model returns :class:`Generation` replies: text that also carries the token ids it
sampled and why it stopped, so that training uses exactly those tokens (see :mod:`baselines.algorithm.samples`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from baselines.algorithm.samples import prompt_ids
from baselines.weights.models import resolve_model
from mappa_envs.core.policy import Conversation, CountsTokens, Generation, Policy, ScriptedPolicy, SubmitsBatches

# torch and transformers are imported inside the functions that use them: importing this module (the CLI, the checks, a
# dry run) loads none of them.


@dataclass
class GenerationConfig:
    max_new_tokens: int = 384
    """Tokens generated per reply at most."""
    temperature: float = 0.6
    """Sampling temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    batch_size: int = 16
    """Conversations per forward batch."""
    max_prompt_tokens: int | None = None
    """Keep only the last N prompt tokens (as the trainers' samples and ``VLLMPolicy`` do); None: the whole prompt."""


class TransformersPolicy:
    """A local causal LM through transformers ``generate`` (CPU float32 by default)."""

    def __init__(
        self,
        model: str,
        config: GenerationConfig | None = None,
        *,
        seed: int = 0,
        device: str = "cpu",
        dtype: str = "float32",
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = resolve_model(model)
        tokenizer = AutoTokenizer.from_pretrained(self.path)
        loaded = AutoModelForCausalLM.from_pretrained(self.path, dtype=getattr(torch, dtype)).to(device)
        self._setup(loaded, tokenizer, config, device, seed)

    def _setup(self, model, tokenizer, config, device, seed) -> None:
        import torch

        self.config = config or GenerationConfig()
        self.device = device
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = model
        self._torch = torch
        torch.manual_seed(seed)
        self.generated_tokens = 0

    @classmethod
    def from_model(cls, model, tokenizer, config: GenerationConfig | None = None, *, seed: int = 0, device="cpu"):
        """Generate with an already loaded model (e.g. the one a trainer updates in place)."""
        self = cls.__new__(cls)
        self.path = getattr(model, "name_or_path", "")
        self._setup(model, tokenizer, config, device, seed)
        return self

    def _prompt_ids(self, conversation: Conversation) -> list[int]:
        """The chat-templated prompt as token ids, cut from the left as the trainers cut it (``prompt_ids``: the
        sample a trainer builds from this action has exactly these prompt tokens)."""
        ids = prompt_ids(self.tokenizer, conversation)
        limit = self.config.max_prompt_tokens
        return ids[-limit:] if limit else ids

    def generate(self, batch: Sequence[Conversation]) -> list[Generation]:
        torch = self._torch
        cfg = self.config
        out: list[Generation] = []
        for start in range(0, len(batch), cfg.batch_size):
            rows = [self._prompt_ids(c) for c in batch[start : start + cfg.batch_size]]
            width = max(len(r) for r in rows)
            pad = self.tokenizer.pad_token_id
            enc = {  # left-padded, so every row's reply starts at the same position
                "input_ids": torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device),
                "attention_mask": torch.tensor(
                    [[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device
                ),
            }
            sample = cfg.temperature > 0
            was_training = self.model.training
            self.model.eval()
            with torch.inference_mode():
                ids = self.model.generate(
                    **enc,
                    max_new_tokens=cfg.max_new_tokens,
                    do_sample=sample,
                    temperature=cfg.temperature if sample else None,
                    top_p=cfg.top_p if sample else None,
                    top_k=None,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            self.model.train(was_training)
            eos = self._eos_ids()
            for row in ids[:, enc["input_ids"].shape[1] :].tolist():
                # generate() pads finished rows (pad may equal EOS): keep up to and including the first EOS
                end = next((i for i, t in enumerate(row) if t in eos), None)
                sampled = row if end is None else row[: end + 1]
                self.generated_tokens += len(sampled)
                text = self.tokenizer.decode(sampled, skip_special_tokens=True)
                out.append(Generation(text, sampled, "length" if end is None else "stop"))
        return out

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids


class TransformersChatBackend:
    """A local transformers model as a coach's chat backend (``LLMCoach(TransformersChatBackend(model))``; greedy
    by default). Calls are serialised (the model is not thread-safe)."""

    def __init__(self, model: str, max_new_tokens: int = 256, temperature: float = 0.0):
        self.policy = TransformersPolicy(
            model, GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature)
        )
        self.name = f"transformers:{model}"
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]]) -> str:
        with self._lock:
            return self.policy.generate([messages])[0]


__all__ = [
    "Conversation",
    "CountsTokens",
    "Generation",
    "GenerationConfig",
    "Policy",
    "ScriptedPolicy",
    "SubmitsBatches",
    "TransformersChatBackend",
    "TransformersPolicy",
]
