"""One role of a team trained by TRL's ``GRPOTrainer`` through its ``environment_factory`` (seat mode): the other
roles are played by given policies, and the trained role's reward is its own (coach or outcome).

Follows TRL 1.16's ``environment_factory`` contract (``trl/trainer/grpo_trainer.py``): the trainer builds one
instance per rollout with ``factory()`` and reuses them; before generating it calls ``reset(**row)`` with the
dataset row's columns, and appends the string ``reset`` returns to the row's last prompt message; every *public*
method other than ``reset`` and ``get_reward`` becomes a tool the model may call, so :class:`SeatEnvironment` has
none. Reward functions get the rollouts' instances as ``environments=``. How one rollout goes:

1. :func:`seat_dataset` gives rows whose ``prompt`` is the seat's messages for a task (system prompt, worked
   examples, an empty last user message) and whose ``task_index`` names the task;
2. ``reset(task_index=..., prompt=...)`` starts the episode, lets the roles before the seat act (their policies),
   checks that the row's prompt is the seat's input for this task, and returns the seat's last user message (the
   task and the earlier agents' work), which TRL puts into the empty one;
3. the model's completion is the seat's reply: :func:`seat_reward` plays it in the environment, lets the roles
   after the seat act, and returns the seat's reward for the episode: the sum of what PettingZoo's ``env.rewards``
   gave the seat's agent, i.e. with ``reward="coach"`` the coach's score / 10 of each of its actions, with
   ``reward="outcome"`` the episode's outcome (0/1 for MathChat). The per-action and per-agent rewards stay on
   ``environment.record`` (see docs/integrations.md for what one scalar per completion cannot carry).

TRL 1.16 requires a chat template that can render tool calls whenever ``environment_factory`` is given, even for an
environment with no tools; :func:`chatml_tool_template` extends a ChatML template (the bundled SmolLM2's) so that it
renders them, and renders every conversation without tool calls byte for byte as before.

Importing this module imports neither TRL nor ``datasets`` (:func:`seat_dataset` imports ``datasets``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .seat import TeamPlay, check_seat

RewardKind = Literal["coach", "outcome"]


@dataclass
class SeatConfig:
    """What every :class:`SeatEnvironment` of a run builds, who plays the other roles, and which reward it trains on."""

    env_id: str
    seat: str
    """The trained role (a role name or an agent id)."""
    others: Any
    """A policy for every other role, or a mapping from role name (or agent id) to policy; called from one thread."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    coach: Any = None
    """A coach (:func:`mappa_envs.coach.coach_from_spec`); required by ``reward="coach"``."""
    reward: RewardKind = "coach"
    later_turns: Any = None
    """A policy for the seat's turns after its first (the completion is one reply); None: a seat with more than one
    turn is refused (MathChat: pass ``code_executor_turns=1`` in ``env_kwargs``)."""


def check_seat_config(config: SeatConfig) -> None:
    """Raise ``ValueError`` with the reason when ``config`` cannot run."""
    if config.reward not in ("coach", "outcome"):
        raise ValueError(f"reward={config.reward!r}: choose 'coach' or 'outcome'")
    if config.reward == "coach" and config.coach is None:
        raise ValueError("reward='coach' needs a coach (coach=RuleBasedCoach(), or coach_from_spec(...))")
    if config.reward == "outcome" and config.coach is not None:
        raise ValueError("reward='outcome' with a coach: the coach's rewards would replace the outcome; drop one")
    check_seat(config.env_id, config.env_kwargs, config.seat, config.others)
    probe = TeamPlay(config.env_id, config.env_kwargs, config.seat, config.others)
    try:
        role = probe.unwrapped.role(probe.seat)
        if role.max_turns > 1 and config.later_turns is None:
            raise ValueError(
                f"seat {config.seat!r} may act {role.max_turns} times in an episode but a completion is one reply: "
                "give later_turns=POLICY for its later turns, or make it act once (MathChat: code_executor_turns=1)"
            )
    finally:
        probe.close()


class SeatEnvironment:
    """One rollout's episode, seen from the seat (see the module's docstring). Public attributes after a rollout:
    ``reward`` (the seat's reward, None before :func:`seat_reward` played it), ``outcome``, ``record`` (the
    episode record: every action with its reward and coach evaluation) and ``totals`` (every agent's reward)."""

    def __init__(self, config: SeatConfig):
        self.config = config
        self._team = TeamPlay(config.env_id, config.env_kwargs, config.seat, config.others, config.coach)
        self.reward: float | None = None
        self.seat_acted = False
        _OPEN.add(self)

    def reset(
        self,
        task_index: int | None = None,
        task_id: str | None = None,
        seed: int | None = None,
        prompt: Sequence[Mapping[str, Any]] | None = None,
        **_columns: Any,
    ) -> str:
        options = {k: v for k, v in (("task_index", task_index), ("task_id", task_id)) if v is not None}
        self._team.reset(seed=seed, options=options)
        self.reward, self.seat_acted = None, False
        if self._team.done():
            return ""  # the episode ended before the seat's turn: seat_reward records it
        messages = _plain_messages(self._team.unwrapped.messages(self._team.seat))
        if prompt is not None and [dict(m) for m in prompt[:-1]] != messages[:-1]:
            raise ValueError(
                f"the dataset row's prompt is not {self.config.seat!r}'s input for task {self.task_id!r}: "
                "build the dataset with seat_dataset() for the same env, seat and env_kwargs"
            )
        return messages[-1]["content"]

    @property
    def task_id(self) -> str | None:
        record = self._team.unwrapped.record
        return None if record is None else record.task_id

    @property
    def record(self) -> Any:
        return self._team.unwrapped.record

    @property
    def outcome(self) -> dict[str, Any]:
        return dict(self.record.outcome) if self.record is not None and self.record.outcome is not None else {}

    @property
    def totals(self) -> dict[str, float]:
        return dict(self._team.totals)

    def _play(self, reply: str) -> float:
        """The seat's reply, then the rest of the episode; the seat's reward (sum of its ``env.rewards``)."""
        team = self._team
        if team.unwrapped.record is None:
            raise RuntimeError("reset() was not called for this rollout")
        if self.reward is not None:
            return self.reward
        if not team.done():
            team.act(reply)
            self.seat_acted = True
        u = team.unwrapped
        while not team.done():  # the seat's later turns (the others act inside act())
            later = self.config.later_turns
            team.act(later.generate([u.messages(team.seat)])[0])
        self.reward = float(team.totals[team.seat])
        return self.reward

    def _close(self) -> None:
        _OPEN.discard(self)
        self._team.close()


class _Open(set):
    """The environments not closed yet (a rollout pool's), guarded by a lock."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def add(self, env: SeatEnvironment) -> None:
        with self.lock:
            super().add(env)

    def discard(self, env: SeatEnvironment) -> None:
        with self.lock:
            super().discard(env)


_OPEN = _Open()


def close_environments() -> int:
    """Close every :class:`SeatEnvironment` of this process (their envs, sandbox sessions and workspaces); call it
    after training. Returns how many were closed."""
    with _OPEN.lock:
        envs = list(_OPEN)
    for env in envs:
        env._close()
    return len(envs)


def seat_environment(
    env_id: str,
    seat: str,
    *,
    others: Any,
    coach: Any = None,
    reward: RewardKind = "coach",
    env_kwargs: Mapping[str, Any] | None = None,
    later_turns: Any = None,
) -> Callable[[], SeatEnvironment]:
    """The ``environment_factory`` for ``GRPOTrainer``: checks the configuration once (raising ``ValueError`` with
    the reason) and returns a callable building one :class:`SeatEnvironment` per rollout."""
    config = SeatConfig(env_id, seat, others, dict(env_kwargs or {}), coach, reward, later_turns)
    check_seat_config(config)
    return functools.partial(SeatEnvironment, config)


def completion_text(completion: Any) -> str:
    """The reply in a completion: a string, or (conversational) the content of its last assistant message, a
    string or a list of ``{"type": "text", "text": ...}`` parts; a message without text is an empty reply, which
    the env records as a malformed action."""
    if isinstance(completion, str):
        return completion
    content = completion[-1].get("content") if completion else ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return content if isinstance(content, str) else ""  # no text (None, a tool call only): an empty reply


def seat_reward(completions: Sequence[Any], environments: Sequence[SeatEnvironment], **kwargs: Any) -> list[float]:
    """The reward function to give ``GRPOTrainer`` beside ``environment_factory``: plays each completion as its
    rollout's seat reply and returns the seat's reward. Logs, per batch, ``mappa/outcome`` (mean episode outcome),
    ``mappa/coach_fallbacks`` (actions whose coach score fell back) and ``mappa/seat_skipped`` (episodes that ended
    before the seat's turn) through TRL's ``log_metric``."""
    rewards = [env._play(completion_text(c)) for c, env in zip(completions, environments, strict=True)]
    log_metric = kwargs.get("log_metric")
    if log_metric is not None:
        outcomes = [float(env.outcome["success"]) for env in environments]
        log_metric("mappa/outcome", sum(outcomes) / max(len(outcomes), 1))
        log_metric("mappa/coach_fallbacks", float(sum(_fallbacks(env.record) for env in environments)))
        log_metric("mappa/seat_skipped", float(sum(not env.seat_acted for env in environments)))
    return rewards


def _fallbacks(record: Any) -> int:
    return sum(1 for a in record.actions if a.coach is not None and a.coach.fallback_used)


def seat_dataset(
    env_id: str, seat: str, *, env_kwargs: Mapping[str, Any] | None = None, tasks: Sequence[int] | None = None
) -> Any:
    """A ``datasets.Dataset`` with one row per task (``tasks``: indices; default every task): ``prompt`` (the
    seat's messages for that task, the last user message empty: ``reset`` fills it) and ``task_index``."""
    from datasets import Dataset

    team = TeamPlay(env_id, env_kwargs, seat, others=None)
    try:
        u = team.unwrapped
        rows = []
        for i in range(len(u.tasks)) if tasks is None else tasks:
            team.env.reset(options={"task_index": i})
            messages = _plain_messages(u.messages(team.seat))
            rows.append({"prompt": [*messages[:-1], {"role": "user", "content": ""}], "task_index": i})
    finally:
        team.close()
    return Dataset.from_list(rows)


def _plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Role and content only (the env marks worked examples with a ``name``, which chat templates ignore)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


_TOOL_CALLS = (
    "{% if message['tool_calls'] is defined and message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>\\n' + ({'name': f['name'], 'arguments': f['arguments']} | tojson) + '\\n</tool_call>' }}"
    "{% endfor %}{% endif %}"
)


def chatml_tool_template(tokenizer: Any) -> Any:
    """``tokenizer`` with its ChatML chat template extended to render assistant tool calls (as ``<tool_call>``
    JSON) and ``None`` contents; a conversation without tool calls renders exactly as before. Raises
    ``ValueError`` for a template that is not the plain ChatML this expects."""
    template = tokenizer.chat_template or ""
    plain = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    if plain not in template:
        raise ValueError(
            "not a plain ChatML chat template: give the tokenizer a chat template that renders tool calls "
            "(TRL's GRPOTrainer requires one with environment_factory)"
        )
    extended = (
        "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['content'] is string %}{{ message['content'] }}"
        "{% endif %}" + _TOOL_CALLS + "{{'<|im_end|>' + '\n'}}"
    )
    tokenizer.chat_template = template.replace(plain, extended)
    return tokenizer


__all__ = [
    "SeatConfig",
    "SeatEnvironment",
    "chatml_tool_template",
    "check_seat_config",
    "close_environments",
    "completion_text",
    "seat_dataset",
    "seat_environment",
    "seat_reward",
]
