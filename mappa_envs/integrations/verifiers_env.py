"""MathChat as a verifiers v1 environment: the three roles as three agents, every agent's trace scored with that
agent's rewards and marked trainable.

Follows ``verifiers==0.4.0``'s ``verifiers.v1``: a :class:`MathChatTaskset` yields one task per MathChat problem; a
:class:`MathChatEnv` (``vf.Env[MathChatEnvConfig]``, roles declared as ``vf.AgentConfig`` fields) plays one episode
of the mappa env per task, each role's reply coming from that role's verifiers agent; a
:class:`MappaChatHarness` is the agents' program: one chat completion per turn, sent in-process to the rollout's
interception endpoint (so verifiers records every model call on the trace, tokens included, as with its own
``null`` harness, without that harness's ``uv``-installed subprocess). The installable package that verifiers'
loader finds by id is ``deploy/verifiers`` (``mappa_mathchat``, id ``mappa-mathchat``); ``vf-eval mappa-mathchat``
runs it.

The mappa env runs as it does under PettingZoo: its sandbox executes the code executor's Python, the coach
(``--env.coach``, a :func:`mappa_envs.coach.coach_from_spec` spec, default ``rule``; ``none``: the outcome only)
scores every action through ``CoachRewardWrapper(..., blocking=True)``. Each trace then gets, as its one reward, the
sum of its agent's action rewards (``--env.traces agent``, the default: one trace per agent, the sum PettingZoo's
``env.rewards`` gives that agent over the episode), or its action's own reward (``--env.traces action``: one trace
per action, so per-action credit survives verifiers' one-scalar-per-trace). ``trace.info["mappa"]`` keeps every
action's reward, issues and coach score; the metrics count malformed replies and coach fallbacks.

Bad input shows, never a silent default: a reply the env finds malformed keeps the env's issues (counted in
``malformed_actions``); an agent whose run ended without a reply (an error, a limit) is given to the env as no
action (``None``, recorded with the reason, counted in ``missing_replies``); a coach reply without a score is the
coach's flagged fallback (``fallback_used``, counted in ``coach_fallbacks``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Literal

import httpx
import verifiers.v1 as vf
from pydantic import field_validator
from verifiers.v1.dialects.chat import message_to_wire, parse_message

from ..registry import make
from .seat import action_entry, episode_done

ENV_ID = "mappa/MathChat-v0"
ROLES = ("problem_solver", "code_executor", "verifier")


# ----------------------------------------------------------------- the harness: one chat completion per turn
class MappaChatHarnessConfig(vf.HarnessConfig):
    request_timeout_s: float = 600.0
    """How long one chat completion may take."""


class MappaChatHarness(vf.Harness[MappaChatHarnessConfig]):
    """A tool-less chat turn run in-process: the conversation so far to the interception endpoint, one reply back.
    Its replies are the roles' actions; the env (not the model) runs the code executor's Python."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages += [message_to_wire(m) for m in prompt]
        url = endpoint.rstrip("/") + "/chat/completions"
        try:
            async with httpx.AsyncClient(timeout=self.config.request_timeout_s) as client:
                response = await client.post(
                    url, json={"model": ctx.model, "messages": messages}, headers={"Authorization": f"Bearer {secret}"}
                )
            response.raise_for_status()
            reply = response.json()["choices"][0]["message"].get("content") or ""
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            return vf.ProgramResult(exit_code=1, stdout="", stderr=f"chat completion failed: {type(e).__name__}: {e}")
        return vf.ProgramResult(exit_code=0, stdout=reply, stderr="")


# ----------------------------------------------------------------- the taskset
class MathChatTasksetConfig(vf.TasksetConfig):
    split: str | None = None
    """A MathChat split (``arith1-eval``, ``aime-eval-32``...); None: the env's default. Sealed splits are refused."""
    data_file: str | None = None
    """A JSON / JSON-lines file of ``{"prompt", "answer"}`` tasks instead of a split."""
    prompt_style: str | None = None
    """``paper`` (the env's default), ``small`` or ``small-balanced``."""
    sandbox: str = "auto"
    """The mappa sandbox that runs the code executor's Python: ``auto``, ``docker``, ``bubblewrap``, ``subprocess``."""
    code_executor_turns: int | None = None

    def env_kwargs(self) -> dict[str, Any]:
        """The ``mappa_envs.make`` arguments these fields give."""
        names = ("split", "data_file", "prompt_style", "code_executor_turns")
        return {"sandbox": self.sandbox, **{k: getattr(self, k) for k in names if getattr(self, k) is not None}}


class MathChatData(vf.TaskData):
    task_index: int
    """The task's position in the mappa env's task list (``reset(options={"task_index": ...})``)."""
    answer: str


class MathChatTask(vf.Task[MathChatData, vf.State, vf.TaskConfig]):
    """A MathChat problem. It has no rewards of its own: the env scores every agent's trace."""


class MathChatTaskset(vf.Taskset[MathChatTask, MathChatTasksetConfig]):
    def load(self) -> list[MathChatTask]:
        env = make(ENV_ID, **self.config.env_kwargs())
        try:
            tasks = list(env.unwrapped.tasks)
        finally:
            env.close()
        return [
            MathChatTask(
                MathChatData(id=t.id, name=t.id, prompt=t.prompt, task_index=i, answer=str(t.answer)),
                self.config.task,
            )
            for i, t in enumerate(tasks)
        ]


# ----------------------------------------------------------------- the env
def _role_agent() -> vf.AgentConfig:
    """A role's default: the taskset's harness (:class:`MappaChatHarness`), on the local runtime (it executes
    nothing: the mappa env's own sandbox runs the code)."""
    return vf.AgentConfig(runtime=vf.SubprocessConfig())


class MathChatEnvConfig(vf.EnvConfig):
    problem_solver: vf.AgentConfig = _role_agent()
    code_executor: vf.AgentConfig = _role_agent()
    verifier: vf.AgentConfig = _role_agent()
    coach: str = "rule"
    """Per-action rewards: a :func:`mappa_envs.coach.coach_from_spec` spec (``rule``, ``rule-hindsight``,
    ``llm:MODEL@URL``, ``package.module:factory``), or ``none`` for the outcome alone."""
    traces: Literal["agent", "action"] = "agent"
    """``agent``: one trace per agent, rewarded with the sum of its actions' rewards; ``action``: one trace per
    action, rewarded with that action's reward."""
    frozen: list[str] = []
    """Roles whose traces are not trained (``trainable=False``), e.g. a fixed verifier on its own
    ``--env.verifier.model``; every other role's traces are trainable."""

    @field_validator("frozen")
    @classmethod
    def _known_roles(cls, roles: list[str]) -> list[str]:
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise ValueError(f"no role {unknown} in {ENV_ID}: its roles are {list(ROLES)}")
        return roles


class MathChatEnv(vf.Env[MathChatEnvConfig]):
    """One MathChat episode per task, each role played by its verifiers agent (see the module's doc)."""

    def mappa_env(self) -> Any:
        """A fresh mappa env for one episode (its own sandbox session), wrapped by the coach when there is one."""
        env = make(ENV_ID, **self.taskset.config.env_kwargs())
        if self.config.coach.strip().lower() != "none":
            from ..coach import CoachRewardWrapper, coach_from_spec

            env = CoachRewardWrapper(env, coach_from_spec(self.config.coach), blocking=True)
        return env

    async def setup(self, agents: vf.Agents) -> None:
        for role in ROLES:  # stated for every role, whatever verifiers' default
            getattr(agents, role).trainable = role not in self.config.frozen

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        env = await asyncio.to_thread(self.mappa_env)
        try:
            await asyncio.to_thread(env.reset, options={"task_index": task.data.task_index})
            roles = env.unwrapped.roles
            seats = {r.agent: _Seat(r.name, getattr(agents, r.name), self.config.traces, task) for r in roles}
            async with contextlib.AsyncExitStack() as stack:
                while not episode_done(env):
                    await _play_turn(env, seats[env.agent_selection], stack)
            _score(env.unwrapped.record, seats, "outcome" if self.config.coach.strip().lower() == "none" else "coach")
        finally:
            await asyncio.to_thread(env.close)


class _Seat:
    """One role in one episode: its agent, its open interaction (``agent`` traces) and the traces it produced."""

    def __init__(self, role: str, agent: vf.Agent, mode: str, task: vf.Task):
        self.role, self.agent, self.mode, self.task = role, agent, mode, task
        self.interaction: Any = None
        self.sent: list[dict] = []
        """The env's messages the open conversation holds (the agent's reply to them follows)."""
        self.traces: dict[int, Any] = {}
        """Action index -> the trace that produced it."""
        self.ended = ""
        """Why the open interaction's run ended ("" while it goes on)."""

    def chat_task(self, messages: list[dict]) -> vf.Task:
        """The task an interaction opens on: the role's system prompt and its input (prompted: the agent speaks
        first). Examples' ``name`` fields are dropped (verifiers' messages carry no name)."""
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        prompt = [parse_message(m) for m in messages[1 if system is not None else 0 :]]
        data = vf.TaskData(idx=self.task.data.idx, id=self.task.data.id, prompt=prompt, system_prompt=system)
        return vf.Task(data)

    async def reply(self, messages: list[dict], index: int, stack: contextlib.AsyncExitStack) -> tuple[Any, str]:
        """The agent's reply to the env's ``messages`` for action ``index``, and why there is none ("" if there
        is one)."""
        if self.mode == "action":
            async with self.agent.interaction(self.chat_task(messages)) as interaction:
                self.traces[index] = interaction.trace
                segment = await interaction.turn()
        elif self.interaction is None:
            self.interaction = await stack.enter_async_context(self.agent.interaction(self.chat_task(messages)))
            self.traces[index] = self.interaction.trace
            segment = await self.interaction.turn()
        else:
            self.traces[index] = self.interaction.trace
            if self.ended:  # its run is over: verifiers refuses another turn
                return None, f"no reply: the agent's run ended at an earlier turn ({self.ended})"
            if messages[: len(self.sent)] != self.sent:  # a sequential pipeline only appends
                raise RuntimeError(f"{self.role}: the env changed messages already sent to the agent")
            # after the sent messages comes the agent's own reply (the env's copy of it), then what is new
            news = [parse_message(m) for m in messages[len(self.sent) + 1 :]]
            segment = await self.interaction.turn(news)
        self.sent = list(messages)
        if segment.terminated:
            trace = self.traces[index]
            errors = "; ".join(f"{e.type}: {e.message}"[:300] for e in trace.errors)
            self.ended = f"{trace.stop_condition}{'; ' + errors if errors else ''}"
            return None, f"no reply: the agent's run ended ({self.ended})"
        return segment.last_reply, ""


async def _play_turn(env: Any, seat: _Seat, stack: contextlib.AsyncExitStack) -> None:
    """The current agent's turn: its seat's reply to the env's messages, stepped in the env (in a thread: the
    sandbox and the coach block); no reply is recorded as such."""
    u = env.unwrapped
    agent, index = env.agent_selection, len(u.record.actions)
    reply, missing = await seat.reply(u.messages(agent), index, stack)
    await asyncio.to_thread(env.step, reply)
    if missing and len(u.record.actions) > index:
        u.record.actions[index].issues.append(f"verifiers: {missing}")


def _score(record: Any, seats: Mapping[str, _Seat], name: str) -> None:
    """Each trace's reward (named ``name``), metrics and ``info["mappa"]`` from the finished episode's record."""
    outcome = {k: v for k, v in (record.outcome or {}).items() if isinstance(v, str | int | float | bool) or v is None}
    totals = {a: sum(x.reward for x in record.actions if x.agent == a) for a in seats}
    for agent, seat in seats.items():
        by_trace: dict[int, tuple[Any, list]] = {}
        for act in record.actions:
            if act.agent == agent and act.index in seat.traces:
                trace = seat.traces[act.index]
                by_trace.setdefault(id(trace), (trace, []))[1].append(act)
        for trace, acts in by_trace.values():
            trace.record_reward(name, sum(float(a.reward) for a in acts))
            entries = [action_entry(a) for a in acts]
            coached = [e["coach"] for e in entries if "coach" in e]
            trace.record_metrics(
                {
                    "correct": float(record.success),
                    "actions": float(len(acts)),
                    "malformed_actions": float(sum(bool(a.issues) for a in acts)),
                    "missing_replies": float(sum(any(i.startswith("verifiers: ") for i in a.issues) for a in acts)),
                    "coach_fallbacks": float(sum(bool(c.get("fallback_used")) for c in coached)),
                }
            )
            trace.info["mappa"] = {
                "env_id": record.env_id,
                "episode_id": record.episode_id,
                "task_id": record.task_id,
                "agent": agent,
                "reward_source": name,
                "actions": entries,
                "agent_total": totals[agent],
                "episode_rewards": totals,
                "outcome": outcome,
            }


__all__ = [
    "MappaChatHarness",
    "MappaChatHarnessConfig",
    "MathChatData",
    "MathChatEnv",
    "MathChatEnvConfig",
    "MathChatTask",
    "MathChatTaskset",
    "MathChatTasksetConfig",
]
