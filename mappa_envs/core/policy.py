"""The policy interface: a batch of chat conversations in, one reply per conversation out.

:class:`Policy` is the whole interface an env, a rollout or a :class:`~mappa_envs.core.SingleAgentView` needs;
rollouts batch every env instance whose current agent shares a policy into one ``generate`` call.
:class:`ScriptedPolicy` replays fixed replies or calls a function (tests, scripted baselines, credit-assignment
scenarios). A policy that samples from a model returns :class:`Generation` replies: text that also carries the
token ids it sampled and why it stopped, so that training uses exactly those tokens. Model-backed policies
(transformers, vLLM, endpoints) live in :mod:`baselines`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from .trajectory import Message

Conversation = Sequence[Message]


class Generation(str):
    """A reply: the text, plus the ``token_ids`` the policy sampled (with the end-of-sequence token when it stopped
    on one) and the ``finish_reason``: ``"stop"`` (it sampled EOS or a stop string) or ``"length"`` (cut at
    ``max_new_tokens``). A ``str``, so every consumer of text takes it as it is. ``logprobs``: the log-probability
    of each sampled token under the generating policy at the sampling temperature, when the engine gives them
    (the vLLM engine does; None otherwise)."""

    token_ids: tuple[int, ...]
    finish_reason: str
    logprobs: tuple[float, ...] | None

    def __new__(
        cls, text: str, token_ids: Sequence[int], finish_reason: str, logprobs: Sequence[float] | None = None
    ) -> Generation:
        self = super().__new__(cls, text)
        self.token_ids = tuple(int(t) for t in token_ids)
        self.finish_reason = finish_reason
        if logprobs is not None and len(logprobs) != len(self.token_ids):
            raise ValueError(f"{len(logprobs)} log-probs for {len(self.token_ids)} sampled tokens")
        self.logprobs = None if logprobs is None else tuple(float(x) for x in logprobs)
        return self

    def __reduce__(self):  # pickles (Ray) as a Generation, not as a plain str
        return (Generation, (str(self), self.token_ids, self.finish_reason, self.logprobs))


@runtime_checkable
class Policy(Protocol):
    def generate(self, batch: Sequence[Conversation]) -> Sequence[str]:
        """One reply per conversation, in order."""
        ...


@runtime_checkable
class SubmitsBatches(Protocol):
    """A policy that can start a batch and wait for it later (an engine actor): rollouts submit every role's batch
    of a round before waiting for any, so engines of different roles generate at once."""

    def submit(self, batch: Sequence[Conversation]) -> Callable[[], list[str]]:
        """Start generating one reply per conversation; the returned function waits for them, in order."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """A policy that counts the tokens it generated (training's tokens/s figures)."""

    generated_tokens: int


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


class SerialPolicy:
    """``policy`` behind a lock: one ``generate`` at a time, for a policy several threads share (the sessions of
    a server) that is not safe to call concurrently (a local model, a :class:`ScriptedPolicy`'s cycling index)."""

    def __init__(self, policy: Policy):
        import threading

        self.policy = policy
        self._lock = threading.Lock()

    def generate(self, batch: Sequence[Conversation]) -> Sequence[str]:
        with self._lock:
            return self.policy.generate(batch)


def policy_for(policies: Policy | Mapping[str, Policy], agent: str, role: str) -> Policy:
    """Look a policy up by agent id, then by role name; a single policy serves every role."""
    if not isinstance(policies, Mapping):
        return policies
    for key in (agent, role):
        if key in policies:
            return policies[key]
    raise KeyError(f"no policy for agent {agent!r} (role {role!r}); given: {sorted(policies)}")


__all__ = [
    "Conversation",
    "CountsTokens",
    "Generation",
    "Policy",
    "ScriptedPolicy",
    "SerialPolicy",
    "SubmitsBatches",
    "policy_for",
]
