"""Training samples from trajectories: one sample per action, grouped per role.

A sample's prompt is the agent's *full* input context at that turn (``ActionRecord.messages``: system prompt, the
task, earlier agents' work, its own earlier turns and their tool feedback), and its response is the action. (The
reference implementation stored an agent's second and later actions with the previous action's text as the
prompt; that is the bug this layout avoids.)

:func:`tokenize_samples` turns samples into right-padded tensors with a mask over the response tokens only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mappa_envs.core import EpisodeRecord, Message


@dataclass
class Sample:
    role: str
    agent: str
    episode_id: str
    task_id: str
    action_index: int
    turn: int
    messages: list[Message]
    response: str
    reward: float
    """Process reward of the action: the coach's score / 10 when present, else the action's own reward."""
    outcome: float
    """The episode's outcome (1/0 for correct/success, or a quality in [0, 1])."""

    @property
    def group_id(self) -> str:
        """Samples that answer the same prompt slot: same task, agent and turn (GRPO's groups)."""
        return f"{self.task_id}|{self.agent}|{self.turn}"


def episode_outcome(rec: EpisodeRecord) -> float:
    for key in ("quality", "correct", "success"):
        if key in rec.outcome:
            return float(rec.outcome[key])
    return 0.0


def samples_from_episodes(records: Iterable[EpisodeRecord]) -> dict[str, list[Sample]]:
    """All actions of all episodes as samples, grouped by role (in episode and action order)."""
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for rec in records:
        outcome = episode_outcome(rec)
        for act in rec.actions:
            coach = act.info.get("coach")
            reward = float(coach["reward"]) if coach else float(act.reward)
            by_role[act.role].append(
                Sample(
                    role=act.role,
                    agent=act.agent,
                    episode_id=rec.episode_id,
                    task_id=rec.task_id,
                    action_index=act.index,
                    turn=act.turn,
                    messages=act.messages,
                    response=act.output,
                    reward=reward,
                    outcome=outcome,
                )
            )
    return dict(by_role)


@dataclass
class TokenBatch:
    input_ids: Any  # [B, L] long
    attention_mask: Any  # [B, L]
    response_mask: Any  # [B, L-1]: 1 where the token at position t+1 is a response token (aligned with logits[:, t])
    prompt_tokens: int
    response_tokens: int


def prompt_ids(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Token ids of a conversation under the tokenizer's chat template, ready for the assistant's reply."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def tokenize_samples(
    samples: Sequence[Sample], tokenizer: Any, max_prompt_tokens: int = 2048, max_response_tokens: int = 512
) -> TokenBatch:
    """Chat-template each prompt, append the response and EOS; truncate prompts from the left, responses from the
    right; pad on the right."""
    import torch

    rows, starts = [], []
    for s in samples:
        prompt = prompt_ids(tokenizer, s.messages)[-max_prompt_tokens:]
        response = tokenizer(s.response, add_special_tokens=False)["input_ids"][: max_response_tokens - 1]
        response = [*response, tokenizer.eos_token_id]
        rows.append(prompt + response)
        starts.append(len(prompt))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        resp[i, start - 1 : len(row) - 1] = 1.0
    return TokenBatch(ids, attn, resp, sum(starts), int(resp.sum()))


def token_logprobs(model: Any, batch: TokenBatch) -> Any:
    """Log-probability of every next token under ``model``: ``[B, L-1]``, meaningful where
    ``batch.response_mask`` is 1 (elsewhere 0). Logits are computed only from the earliest response position on
    (``logits_to_keep``): the vocabulary projection of long prompts is the costly part and is not needed."""
    import torch

    width = batch.input_ids.shape[1]
    cols = batch.response_mask.any(dim=0).nonzero()
    first = int(cols[0]) if len(cols) else width - 2  # first logit position that predicts a response token
    keep = width - first  # logits for positions first .. width-1 (the last one predicts nothing and is dropped)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    logits = logits[:, :-1].float()
    targets = batch.input_ids[:, first + 1 :]
    picked = torch.gather(logits, 2, targets[:, :, None]).squeeze(2) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(batch.input_ids.shape[0], width - 1, dtype=picked.dtype, device=picked.device)
    out[:, first:] = picked
    return out
