"""Policies: a batch of chat conversations in, one reply per conversation out.

:class:`Policy` is the whole interface; rollouts batch every env instance whose current agent shares a policy
into one ``generate`` call. :class:`TransformersPolicy` runs a local causal LM; :class:`ScriptedPolicy` replays
fixed replies or calls a function (tests, scripted baselines, credit-assignment scenarios).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from mappa_envs.core import Message

Conversation = Sequence[Message]


@runtime_checkable
class Policy(Protocol):
    def generate(self, batch: Sequence[Conversation]) -> list[str]:
        """One reply per conversation, in order."""
        ...


class ScriptedPolicy:
    """Replies from a function of the conversation, or from a fixed list (cycled)."""

    def __init__(self, replies: Callable[[Conversation], str] | Sequence[str]):
        if callable(replies):
            self._fn = replies
        else:
            replies = list(replies)
            if not replies:
                raise ValueError("ScriptedPolicy needs at least one reply")
            self._replies = replies
            self._i = 0
            self._fn = self._next
        self.calls = 0

    def _next(self, _conversation: Conversation) -> str:
        reply = self._replies[self._i % len(self._replies)]
        self._i += 1
        return reply

    def generate(self, batch: Sequence[Conversation]) -> list[str]:
        self.calls += len(batch)
        return [self._fn(conv) for conv in batch]


@dataclass
class GenerationConfig:
    max_new_tokens: int = 384
    """Tokens generated per reply at most."""
    temperature: float = 0.6
    """Sampling temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    batch_size: int = 16
    """Conversations per forward batch."""


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

        from .models import resolve_model

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

    def _prompt(self, conversation: Conversation) -> str:
        return self.tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)

    def generate(self, batch: Sequence[Conversation]) -> list[str]:
        torch = self._torch
        cfg = self.config
        out: list[str] = []
        for start in range(0, len(batch), cfg.batch_size):
            prompts = [self._prompt(c) for c in batch[start : start + cfg.batch_size]]
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
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
            new = ids[:, enc["input_ids"].shape[1] :]
            self.generated_tokens += int((new != self.tokenizer.pad_token_id).sum())
            out.extend(self.tokenizer.batch_decode(new, skip_special_tokens=True))
        return out
