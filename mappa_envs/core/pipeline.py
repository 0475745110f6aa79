"""The sequential role pipeline: a PettingZoo ``AECEnv`` that every mappa task builds on.

Agents act in a fixed order of roles (for MathChat: problem solver, code executor, verifier). Each role acts up
to ``max_turns`` times; its turns end early as soon as an action calls none of its tools (or the role has none).
A tool-using role's calls (```python blocks for the python tool) run in the episode's sandbox session, whose
workspace persists for the whole episode, and the tool feedback is shown to the role itself (next turn) and to
every later role.

Observation: the agent's input as text (a rendering of its chat messages: system prompt, worked examples, task,
earlier agents' outputs and tool results, its own earlier turns); ``env.unwrapped.messages(agent)`` gives them as
chat messages, which is what a policy consumes. Action: the agent's reply, as text. Any value is accepted:
malformed actions (empty, enormous, bytes, an unclosed fence) are recorded with their issues and the episode goes
on. Reward: the task outcome (``grade``), given to every agent when the episode ends; the trajectory credits it to
each agent's last action. Process rewards come from the coach wrapper. Every action is recorded in
``env.unwrapped.record`` (an :class:`EpisodeRecord`) with its full input messages.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import AECEnv

from sandboxes import ExecStatus, Sandbox, Session, make_sandbox

from .text import (
    TextObservation,
    format_feedback,
    normalize_action,
    prose,
    render_messages,
    sanitize,
    text_space,
    truncate_middle,
)
from .tools import get_tool
from .trajectory import ActionRecord, EpisodeRecord, Message, OutcomeKind, ToolCall, checked_outcome

PYTHON_TOOL = "python"
HANDOFFS = ("code", "results")
"""What a later role sees of an earlier role's action: ``"code"``, its reply and its tool results; ``"results"``,
its tool results only (when it called no tool, its reply without any fenced block, closed or not). Small models
copy the nearest code in their context; ``"results"`` keeps an earlier role's code out of it."""


@dataclass(frozen=True)
class Role:
    """One agent of a pipeline."""

    name: str
    """Role name; the agent id is ``f"{name}_0"`` (PettingZoo's ``[a-z]+_[0-9]+`` convention)."""
    system_prompt: str
    instruction: str
    """Appended to the first user message: what this role must do now."""
    max_turns: int = 1
    tools: tuple[str, ...] = ()
    """Names of the tools the role may call (:mod:`mappa_envs.core.tools`), e.g. ``("python",)``."""
    coach_guidance: str = ""
    """What a good action of this role looks like, for LLM coaches (overrides the coach's template for it)."""
    answers: bool = False
    """The role states the task's answer (in ``\\boxed{}``), final or not: coaches score its answer and its
    calculations (MathChat's solver and verifier). A role with ``tools`` is scored on its tool use."""
    continue_instruction: str = "Your code was executed; the result is above. Continue."
    """User message after the role's own tool feedback, opening its next turn."""
    examples: tuple[tuple[str, str], ...] = ()
    """Worked examples shown as earlier chat turns, after the system prompt: (user message, assistant reply)
    pairs. Small models follow a format far more reliably from a demonstrated turn than from a description. The
    example messages carry ``"name": "example"`` (the chat format's optional name field) so that coaches can tell
    them from the episode (:func:`mappa_envs.coach.protocol.inputs_for_episode`)."""

    @property
    def agent(self) -> str:
        return f"{self.name}_0"

    @property
    def title(self) -> str:
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class Task:
    """One problem instance."""

    id: str
    prompt: str
    answer: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


class PipelineEnv(AECEnv, abc.ABC):
    """Base class of the sequential multi-agent pipelines. Subclasses give roles, tasks and ``grade``.

    What a task declares (class attributes, with these defaults): ``env_id``; ``task_type`` (what kind of task:
    coaches and the bias report group by it, a task's ``metadata["task_type"]`` overrides it per task);
    ``coach_template`` (the LLM coach's prompt template, :mod:`mappa_envs.coach.templates`); ``artifacts`` (per role,
    the workspace files it must write: the hand-over contract the rule-based coach checks); and, for evaluation,
    the classmethod ``heldout_kwargs`` (its held-out tasks), its names and named suites in ``mappa eval --suites``
    (``eval_names``, ``eval_suites``, the classmethod ``suite_kwargs``: :mod:`mappa_envs.suites`); ``outcome_kind``:
    ``"answer"`` (an episode is right or wrong: evaluations report accuracy) or ``"graded"`` (its result has a
    quality in [0, 1]: success rate and mean quality). ``grade`` returns the reward and the outcome (see
    ``trajectory.checked_outcome``). ``sandbox`` None: :func:`sandboxes.default_backend` (isolated); the backend
    used is in each record's ``metadata["sandbox"]``. ``handoff`` (:data:`HANDOFFS`): what later roles see of
    earlier actions (a record made with ``"results"`` says so in ``metadata["handoff"]``)."""

    metadata: dict[str, Any] = {
        "render_modes": ["human", "ansi"],
        "name": "mappa_pipeline",
        "is_parallelizable": False,
    }
    env_id: str = "mappa/Pipeline-v0"
    task_type: str = "task"
    coach_template: str = "default"
    sealed_splits: tuple[str, ...] = ()  # built only with unseal=True, each evaluation logged (mappa_envs.sealed)
    artifacts: Mapping[str, tuple[str, ...]] = {}
    outcome_kind: OutcomeKind = "answer"
    eval_names: tuple[str, ...] = ()  # `mappa eval --suites NAME[:SPLIT]` (mappa_envs.suites); () -> the id's name
    eval_suites: Mapping[str, Mapping[str, Any]] = {}  # named evaluation suites: name -> constructor arguments

    def __init__(
        self,
        roles: Sequence[Role],
        tasks: Sequence[Task],
        *,
        sandbox: str | Sandbox | None = None,
        sandbox_kwargs: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        max_action_chars: int = 16_000,
        max_feedback_chars: int = 4_000,
        max_observation_chars: int = 2**18,
        max_action_space_chars: int = 32_768,
        handoff: str = "code",
    ):
        super().__init__()
        if handoff not in HANDOFFS:
            raise ValueError(f"handoff must be one of {HANDOFFS}, not {handoff!r}")
        self.handoff = handoff
        if not roles:
            raise ValueError("a pipeline needs at least one role")
        if not tasks:
            raise ValueError("a pipeline needs at least one task")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, not {render_mode!r}")
        self.roles = tuple(roles)
        for r in self.roles:
            for name in r.tools:
                get_tool(name)  # an unknown tool fails here, not at the first action that calls it
        self.tasks = tuple(tasks)
        self.render_mode = render_mode
        self.max_action_chars = max_action_chars
        self.max_feedback_chars = max_feedback_chars
        self.max_observation_chars = max_observation_chars
        self.possible_agents = [r.agent for r in self.roles]
        if len(set(self.possible_agents)) != len(self.possible_agents):
            raise ValueError(f"role names must be unique: {[r.name for r in self.roles]}")
        self._role_of = {r.agent: r for r in self.roles}
        self._order = {r.agent: i for i, r in enumerate(self.roles)}
        # Spaces are built once; the same object is returned on every call.
        self.observation_spaces = {a: text_space(max_observation_chars) for a in self.possible_agents}
        self.action_spaces = {a: text_space(max_action_space_chars) for a in self.possible_agents}
        self._sandbox = make_sandbox(sandbox, **(sandbox_kwargs or {}))
        self._session: Session | None = None
        self.np_random: np.random.Generator | None = None
        self.np_random_seed: int | None = None
        self.record: EpisodeRecord | None = None
        self.task: Task | None = None
        self.agents: list[str] = []

    # ----------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def grade(self, task: Task, record: EpisodeRecord) -> tuple[float, dict[str, Any]]:
        """Score a finished episode: ``(reward in [0, 1] given to every agent, outcome dict for infos/trajectory)``.
        The outcome must hold ``success`` (bool), and a graded task's ``quality``; ``score`` (the reward) and
        ``kind`` are added to it."""

    def task_prompt(self, task: Task) -> str:
        """The task as agents read it."""
        return task.prompt

    def examples(self, role: Role, task: Task) -> tuple[tuple[str, str], ...]:
        """The worked examples ``role`` is shown with ``task``: by default its own (:attr:`Role.examples`)."""
        return role.examples

    def on_episode_start(self, task: Task) -> None:
        """Prepare the workspace for ``task`` (e.g. copy data files via ``self.session.write_file``)."""

    def on_action(self, action: ActionRecord) -> None:
        """Called with each action once it is recorded, before the next agent acts or the episode is graded (e.g. to
        check the files it wrote and note the result in ``action.info``)."""

    def artifacts_for(self, record: EpisodeRecord) -> dict[str, tuple[str, ...]]:
        """The hand-over contract ``record`` was played under (a task whose contract varies per task reads it from
        the record's metadata); by default :attr:`artifacts`."""
        return dict(self.artifacts)

    def role(self, agent: str) -> Role:
        """The :class:`Role` an agent plays."""
        return self._role_of[agent]

    @classmethod
    def heldout_kwargs(cls, train_kwargs: Mapping[str, Any], split: str | None = None) -> dict[str, Any] | None:
        """The constructor arguments of the held-out version of this task, given those it trains with.

        Evaluation (``TrainerBase.evaluate``, ``mappa train --eval-episodes``) builds the env with the returned
        arguments and runs its tasks 0, 1, ... in order; they must be disjoint from the training pool. ``split``
        is the held-out split asked for (``TrainConfig.eval_split``), or None: a task with named splits uses it
        when it is one of them, a task without ignores it. Keep the other arguments (suite, data folder, seed,
        sandbox) from ``train_kwargs``. The default, None, declares no held-out tasks: evaluation refuses.
        See :func:`mappa_envs.heldout.heldout_env_kwargs`.
        """
        return None

    @classmethod
    def suite_kwargs(cls, split: str) -> dict[str, Any]:
        """The constructor arguments of the evaluation suite ``<name>:<split>`` (``mappa eval --suites sql:eval``,
        :mod:`mappa_envs.suites`). The default, ``{"split": split}``, leaves it to the constructor to refuse a split
        it does not have."""
        return {"split": split}

    # ----------------------------------------------------------------- spaces
    def observation_space(self, agent: str):
        return self.observation_spaces[agent]

    def action_space(self, agent: str):
        return self.action_spaces[agent]

    # ----------------------------------------------------------------- episode
    @property
    def session(self) -> Session:
        """The episode's sandbox session (opened on first use; closed at the next reset or ``close``)."""
        if self._session is None:
            self._session = self._sandbox.session()
        return self._session

    @property
    def sandbox_backend(self) -> str:
        """The sandbox backend that runs this env's tool calls (``subprocess``, ``bubblewrap``, ``docker``...)."""
        return self._sandbox.name

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None or self.np_random is None:
            self.np_random, self.np_random_seed = seeding.np_random(seed)
        self._close_session()
        options = options or {}
        self.task = self._pick_task(options)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict[str, Any]] = {a: {"role": self._role_of[a].name} for a in self.agents}
        self._turns = {a: 0 for a in self.agents}
        self._skip_agent_selection = None
        self.agent_selection = self.agents[0]
        assert self.np_random is not None
        episode_id = uuid.UUID(bytes=self.np_random.bytes(16)).hex  # reproducible under a seed
        self.record = EpisodeRecord(
            env_id=self.env_id,
            episode_id=episode_id,
            task_id=self.task.id,
            task=self.task.prompt,
            seed=seed,
            ground_truth=self.task.answer,
            metadata={
                **self.task.metadata,
                "sandbox": self._sandbox.name,
                **({"handoff": self.handoff} if self.handoff != "code" else {}),
            },
        )
        self.on_episode_start(self.task)

    def _pick_task(self, options: Mapping[str, Any]) -> Task:
        if "task_index" in options:
            return self.tasks[int(options["task_index"])]
        if "task_id" in options:
            for t in self.tasks:
                if t.id == options["task_id"]:
                    return t
            raise KeyError(f"no task with id {options['task_id']!r}")
        assert self.np_random is not None  # reset() seeds it first
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    def step(self, action: Any) -> None:
        if self.record is None:
            raise RuntimeError("call reset() before step()")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        role = self._role_of[agent]
        messages = self.messages(agent)
        parsed = normalize_action(action)
        tool_calls = []
        for name in role.tools:  # each tool finds its calls in the action (see mappa_envs.core.tools)
            tool = get_tool(name)
            for call in tool.calls(parsed.text):
                result = tool.run(self.session, call)
                tool_calls.append(ToolCall(name, call, result, format_feedback(result, self.max_feedback_chars)))
                if result.status == ExecStatus.WORKER_LOST:  # the sandbox's fault, not the agent's: say so
                    parsed.issues.append(f"{name} call {len(tool_calls)} has no result: {result.error}")
        if len(parsed.text) > self.max_action_chars:
            parsed.issues.append(
                f"output of {len(parsed.text)} characters shown truncated to {self.max_action_chars} to later agents"
            )
        self._turns[agent] += 1
        record = ActionRecord(
            index=len(self.record.actions),
            agent=agent,
            role=role.name,
            turn=self._turns[agent],
            messages=messages,
            output=parsed.text,
            tool_calls=tool_calls,
            issues=parsed.issues,
            raw_output_b64=parsed.raw_b64,
        )
        self.record.actions.append(record)
        self.on_action(record)
        self._clear_rewards()
        self.infos[agent] = {
            "role": role.name,
            "turn": record.turn,
            "issues": list(record.issues),
            "tool_status": [str(c.result.status) for c in tool_calls],
        }
        if tool_calls and self._turns[agent] < role.max_turns:
            pass  # same agent again: it sees its own tool feedback
        elif self._order[agent] + 1 < len(self.roles):
            self.agent_selection = self.roles[self._order[agent] + 1].agent
        else:
            self._finish()
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def _finish(self) -> None:
        assert self.record is not None and self.task is not None
        reward, graded = self.grade(self.task, self.record)
        self.record.outcome = outcome = checked_outcome(type(self).__name__, self.outcome_kind, reward, graded)
        last_action: dict[str, ActionRecord] = {a.agent: a for a in self.record.actions}
        for a in self.agents:
            self.rewards[a] = float(reward)
            self.terminations[a] = True
            self.infos[a] = {**self.infos[a], **outcome}
            if a in last_action:
                last_action[a].reward += float(reward)
        self._deads_step_first()

    # ----------------------------------------------------------------- observations
    def _context_block(self, act: ActionRecord) -> str:
        role = self._role_of[act.agent]
        title = f"### {role.title.capitalize()}"
        if role.max_turns > 1:
            title += f" (turn {act.turn})"
        parts = [title]
        if self.handoff == "code":
            parts.append(truncate_middle(act.output, self.max_action_chars).strip() or "(empty reply)")
        elif not act.tool_calls:  # what it said; a block that did not run (left open, say) is code all the same
            said = prose(truncate_middle(act.output, self.max_action_chars)).strip()
            parts.append(said or "(no result: none of its code ran, and it said nothing else)")
        for call in act.tool_calls:
            parts.append(f"### Result of running the {role.title}'s code\n{call.feedback}")
        return "\n".join(parts)

    def messages(self, agent: str) -> list[Message]:
        """The chat messages ``agent`` acts on now: its full input context."""
        if self.record is None or self.task is None:
            raise RuntimeError("call reset() first")
        role = self._role_of[agent]
        upstream = [a for a in self.record.actions if self._order[a.agent] < self._order[agent]]
        own = [a for a in self.record.actions if a.agent == agent]
        first = ["## Task\n" + self.task_prompt(self.task).strip()]
        if upstream:
            first.append("## Work of the earlier agents\n" + "\n\n".join(self._context_block(a) for a in upstream))
        first.append("## Your job\n" + role.instruction.strip())
        msgs: list[Message] = [{"role": "system", "content": sanitize(role.system_prompt.strip())}]
        for user, reply in self.examples(role, self.task):
            msgs.append({"role": "user", "content": sanitize(user.strip()), "name": "example"})
            msgs.append({"role": "assistant", "content": sanitize(reply.strip()), "name": "example"})
        msgs.append({"role": "user", "content": sanitize("\n\n".join(first))})
        for act in own:
            msgs.append({"role": "assistant", "content": sanitize(truncate_middle(act.output, self.max_action_chars))})
            if act.tool_calls:
                feedback = "\n\n".join(c.feedback for c in act.tool_calls)
                content = sanitize(f"{feedback}\n\n{role.continue_instruction.strip()}")
                msgs.append({"role": "user", "content": content})
        return msgs

    def observe(self, agent: str) -> str:
        return TextObservation(truncate_middle(render_messages(self.messages(agent)), self.max_observation_chars))

    # ----------------------------------------------------------------- rendering, closing
    def transcript(self) -> str:
        """A readable transcript of the episode so far."""
        if self.record is None:
            return "(no episode: call reset())"
        rec = self.record
        lines = [f"=== {rec.env_id} | task {rec.task_id} ===", rec.task.strip(), ""]
        for act in rec.actions:
            lines.append(f"--- {act.agent} (turn {act.turn}) ---")
            lines.append(act.output.strip() or "(empty reply)")
            lines.extend(f"  ! {issue}" for issue in act.issues)
            for call in act.tool_calls:
                lines.append(f"[{call.tool}] " + call.feedback.replace("\n", "\n    "))
            lines.append("")
        if rec.outcome:
            lines.append("=== outcome: " + ", ".join(f"{k}={v!r}" for k, v in rec.outcome.items()) + " ===")
        return "\n".join(lines)

    def render(self) -> str | None:
        if self.render_mode is None:
            import gymnasium

            gymnasium.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'")
            return None
        text = self.transcript()
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def close(self) -> None:
        self._close_session()
        self._sandbox.close()

    def __del__(self) -> None:
        try:
            self._close_session()
        except Exception:
            pass


__all__ = ["PYTHON_TOOL", "PipelineEnv", "Role", "Task"]
