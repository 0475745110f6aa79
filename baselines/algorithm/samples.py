"""Training samples from trajectories: one sample per action, grouped per role.

A sample's prompt is the agent's *full* input context at that turn (``ActionRecord.messages``: system prompt, the
task, earlier agents' work, its own earlier turns and their tool feedback), and its response is the action. (The
reference implementation stored an agent's second and later actions with the previous action's text as the
prompt; that is the bug this layout avoids.)

A sample trains on what the policy *sampled*: the token ids the engine generated (stored by the rollout in the
action's ``generation``), with no end-of-sequence token added where the engine did not sample one (a
response cut at ``max_new_tokens``, ``truncated``). Only actions without stored ids (scripted policies, rollouts
stored before ids were kept) are re-tokenised from their text, with EOS appended (``Sample.retokenized``, counted in
the training metrics as ``retokenized_responses``).

Its reward is the reward the (wrapped) env gave the action (``ActionRecord.reward``): the coach's score / 10, or a
``MixedRewardWrapper``'s mix of it with the outcome, or the env's own reward without a coach.

:func:`tokenize_samples` turns samples into right-padded tensors with a mask over the response tokens only.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mappa_envs.core import CoachEvaluation, EpisodeRecord, Message

# torch are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run) loads
# none of them.


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
    """The reward the wrapped env gave the action (coach score / 10, a mix with the outcome, or the env's own)."""
    outcome: float
    """The episode's outcome (1/0 for correct/success, or a quality in [0, 1])."""
    response_ids: list[int] | None = None
    """Token ids the policy sampled (EOS included when it stopped on one); None: re-tokenise ``response``."""
    truncated: bool = False
    """Generation did not stop on its own (cut at ``max_new_tokens``, or aborted): no EOS was sampled."""
    coach: CoachEvaluation | None = None
    """The coach's evaluation of the action, when there was a coach."""
    response_logprobs: list[float] | None = None
    """Log-probability of each of ``response_ids`` under the policy that sampled it, at the sampling temperature,
    as the engine computed it (None: not given). The distributed trainer uses them instead of a policy forward
    pass where that pass would only recompute them (:meth:`baselines.training.ray_trainer.RayTrainer.update`)."""

    @property
    def retokenized(self) -> bool:
        """No sampled ids were stored (a scripted policy, or rollouts stored before ids were kept): the response
        is re-tokenised from its text, with EOS appended."""
        return self.response_ids is None

    @property
    def coach_fallback(self) -> bool:
        """The coach's score is a fallback (no score parsed, the call failed), not a judgement."""
        return bool(self.coach and self.coach.fallback_used)

    @property
    def group_id(self) -> str:
        """GRPO's group: every action of this agent in the samples of this task (all turns pooled; see
        :mod:`baselines.algorithm.advantages`)."""
        return f"{self.task_id}|{self.agent}"


def samples_from_episodes(records: Iterable[EpisodeRecord]) -> dict[str, list[Sample]]:
    """All actions of all episodes as samples, grouped by role (in episode and action order)."""
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for rec in records:
        outcome = rec.score  # the env's reward for the episode: outcome-only training's return
        for act in rec.actions:
            gen = act.generation
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
                    reward=float(act.reward),
                    outcome=outcome,
                    response_ids=list(gen.token_ids) if gen is not None else None,
                    truncated=gen is not None and gen.truncated,
                    coach=act.coach,
                    response_logprobs=list(gen.logprobs) if gen is not None and gen.logprobs is not None else None,
                )
            )
    return dict(by_role)


def _requests(ev: CoachEvaluation) -> int:
    """Requests an evaluation sent to a coach model: 1 + retries + a re-prompt; none from the cache or from a
    rule-based coach; an ensemble's, its members'."""
    if ev.members:
        return sum(_requests(m) for m in ev.members)
    if ev.cached or ev.parse == "rule":
        return 0
    return 1 + ev.retries + ev.reprompted


def coach_counts(samples: Sequence[Sample]) -> dict[str, float]:
    """What the coach did for these actions: evaluations, requests sent (1 + retries + a re-prompt each, none when
    cached), retries, re-prompts, lenient parses, ambiguous replies (several different scores), fallbacks, actions
    whose text addressed the coach (the injection guard's ``coach_directed_text``) and scores equal to one the agent
    wrote (``score_echoed``), all read from each action's stored evaluation; and, over the evaluations that asked a
    coach model, the mean and largest call latency and the mean wait for a free coach slot (seconds)."""
    evs = [s.coach for s in samples if s.coach]
    asked = [e for e in evs if _requests(e)]
    return {
        "coach_evaluations": len(evs),
        "coach_calls": sum(_requests(e) for e in evs),
        "coach_retries": sum(e.retries for e in evs),
        "coach_reprompts": sum(e.reprompted for e in evs),
        "coach_lenient": sum(e.parse == "lenient" for e in evs),
        "coach_ambiguous": sum(e.ambiguous for e in evs),
        "coach_fallbacks": sum(e.fallback_used for e in evs),
        "coach_directed_text": sum(bool(e.coach_directed_text) for e in evs),
        "coach_score_echoed": sum(e.score_echoed for e in evs),
        **(
            {
                "coach_latency_s": sum(e.latency_s for e in asked) / len(asked),
                "coach_latency_max_s": max(e.latency_s for e in asked),
                "coach_queue_s": sum(e.queue_s for e in asked) / len(asked),
            }
            if asked
            else {}
        ),
    }


def select_trainable(
    samples: Sequence[Sample], *, mask_fallbacks: bool, mask_truncated: bool
) -> tuple[list[Sample], dict[str, int]]:
    """The samples the loss sees, and how many were masked and why. A masked sample contributes nothing: not to
    the loss, nor to the advantage normalisation (it is left out before advantages are computed).

    ``mask_fallbacks``: actions whose coach evaluation is a fallback (their reward is a neutral 5/10 that no one
    judged). ``mask_truncated``: responses cut at ``max_new_tokens``. Empty responses (nothing sampled) are always
    left out. Re-tokenised responses are counted (``retokenized_responses``), not masked."""
    kept, fallbacks, truncated, empty = [], 0, 0, 0
    for s in samples:
        if s.response_ids is not None and not s.response_ids:
            empty += 1  # nothing sampled (an aborted request): no token to carry a reward
        elif mask_fallbacks and s.coach_fallback:
            fallbacks += 1
        elif mask_truncated and s.truncated:
            truncated += 1
        else:
            kept.append(s)
    return kept, {
        "masked_fallbacks": fallbacks,
        "masked_truncated": truncated,
        "masked_empty": empty,
        "masked_actions": fallbacks + truncated + empty,
        "truncated_responses": sum(s.truncated for s in samples),
        "retokenized_responses": sum(s.retokenized for s in samples),
    }


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


def sample_rows(
    samples: Sequence[Sample], tokenizer: Any, max_prompt_tokens: int = 2048, max_response_tokens: int = 512
) -> list[tuple[list[int], int]]:
    """Per sample, its tokens as the trainer sees them and the index of the first response token: the chat-templated
    prompt (truncated from the left, as the policies do) followed by the response's token ids (:func:`response_ids`,
    at most ``max_response_tokens``)."""
    rows = []
    for s in samples:
        prompt = prompt_ids(tokenizer, s.messages)[-max_prompt_tokens:]
        response = response_ids(s, tokenizer)
        if s.retokenized and len(response) > max_response_tokens:  # keep the EOS that ends re-tokenised text
            response = [*response[: max_response_tokens - 1], response[-1]]
        rows.append((prompt + response[:max_response_tokens], len(prompt)))
    return rows


def tokenize_samples(
    samples: Sequence[Sample], tokenizer: Any, max_prompt_tokens: int = 2048, max_response_tokens: int = 512
) -> TokenBatch:
    """The samples' rows (:func:`sample_rows`) as right-padded tensors with a mask over the response tokens."""
    import torch

    rows = sample_rows(samples, tokenizer, max_prompt_tokens, max_response_tokens)
    width = max(len(r) for r, _ in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for i, (row, start) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        resp[i, start - 1 : len(row) - 1] = 1.0
    return TokenBatch(ids, attn, resp, sum(start for _, start in rows), int(resp.sum()))


def response_ids(sample: Sample, tokenizer: Any) -> list[int]:
    """The ids the policy sampled, as they were (no EOS added to a truncated response); for a sample without them,
    the response re-tokenised with EOS appended."""
    if sample.response_ids is not None:
        return list(sample.response_ids)
    return [*tokenizer(sample.response, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


def autocast(dtype: str | None, device: Any) -> Any:
    """A context in which forward passes on ``device`` run under ``torch.autocast`` in ``dtype`` (mixed precision:
    the weights and their gradients keep their own dtype), or does nothing for ``dtype`` None
    (``TrainConfig.resolved_autocast``)."""
    import torch

    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype))


def token_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0) -> Any:
    """Log-probability of every next token under ``model`` at the sampling ``temperature`` (logits / T, as the
    rollouts sampled them; OpenRLHF and verl do the same): ``[B, L-1]``, meaningful where ``batch.response_mask``
    is 1 (elsewhere 0). Logits are computed only from the earliest response position on (``logits_to_keep``): the
    vocabulary projection of long prompts is the costly part and is not needed. ``temperature <= 0`` (greedy) is
    taken as 1."""
    import torch

    width = batch.input_ids.shape[1]
    cols = batch.response_mask.any(dim=0).nonzero()
    first = int(cols[0]) if len(cols) else width - 2  # first logit position that predicts a response token
    keep = width - first  # logits for positions first .. width-1 (the last one predicts nothing and is dropped)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    logits = logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, first + 1 :]
    picked = torch.gather(logits, 2, targets[:, :, None]).squeeze(2) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(batch.input_ids.shape[0], width - 1, dtype=picked.dtype, device=picked.device)
    out[:, first:] = picked
    return out
