"""Re-score stored episodes with another coach, without new rollouts (``mappa rescore``).

Comparing coaches used to cost a training run per coach. Stored episodes (a training run's ``rollouts/``, the
trajectories of ``mappa run`` or ``mappa eval``) hold every action with its full input, tool results and workspace
changes, so each action's coach input is rebuilt exactly as the reward wrapper built it during the rollout
(:func:`~mappa_envs.coach.protocol.inputs_for_episode`; re-scoring with the coach that scored the run gives its
scores back) and sent to the new coach, many at once (:class:`~mappa_envs.coach.wrapper.CoachPool`).

Output in ``out_dir``: ``trajectories.jsonl`` (every episode, each action holding its original evaluation in
``info["coach"]`` and the new one in ``info[name]``), ``evaluations.jsonl`` (each new evaluation appended as soon as
it is made, keyed by its input: a killed re-score continues without asking the coach again for an action it
already scored), ``summary.json`` (counts: actions, new calls, re-used evaluations, fallbacks).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core import EpisodeRecord, read_jsonl
from .coaches import Coach
from .dsbench_hindsight import DSBenchHindsightCoach
from .dsbench_rules import DSBenchCoach
from .hindsight import HindsightCoach, RuleHindsightCoach
from .information import information_label
from .protocol import CoachEvaluation, CoachInput, inputs_for_episode
from .rule_based import RuleBasedCoach
from .wrapper import CoachPool, EpisodePart

COACH_SPECS: dict[str, str] = {
    "rule": "the rule-based stand-in for the method's LLM coach: a hand-written rubric scores each action (tool "
    "status, format, the answer); it sees the ground truth only when scoring the final agent's answer",
    "rule-hindsight-key": "an answer-key coach: one call per finished episode, the rule coach's scores with blame "
    "moved by the outcome and every printout checked against the ground truth",
    "rule-hindsight": "the same coach as rule-hindsight-key (its older name, kept for stored runs)",
    "rule-hindsight-outcome": "rule-hindsight-key without the answer key: blame moved by the outcome only",
    "dsbench-rule": "DSBench's progress coach: partial credit for how far each block got and which hand-over files "
    "pass the env's check; reads the host's scoring of the submission at the last action",
    "dsbench-rule-blind": "dsbench-rule without the submission's scoring",
    "dsbench-rule-hindsight": "DSBench's progress coach as a hindsight coach (one call per finished episode)",
    "llm:MODEL@URL": "the method's coach: an LLM on an OpenAI-compatible server (e.g. `vllm serve`) scores each "
    "action; URL may be left out for the default OpenAI endpoint",
    "llm-hindsight:MODEL@URL": "an LLM that reads a whole finished episode and scores every action in one reply",
    "package.module:factory": "your own coach: a callable, called with no arguments, returning one",
}
"""Every coach spec :func:`coach_from_spec` takes, with what each coach is and what it sees: the source of the
``--coach`` help (``mappa train``, ``mappa rescore``) and of the test that each is accepted."""

_RULE_COACHES: dict[str, Callable[[], Coach]] = {
    "rule": RuleBasedCoach,
    "rule-hindsight-key": RuleHindsightCoach,
    "rule-hindsight": RuleHindsightCoach,
    "rule-hindsight-outcome": lambda: RuleHindsightCoach(answer_key=False),
    "dsbench-rule": lambda: DSBenchCoach(use_outcome=True),
    "dsbench-rule-blind": lambda: DSBenchCoach(use_outcome=False),
    "dsbench-rule-hindsight": DSBenchHindsightCoach,
}
_LLM_PREFIXES = ("llm:", "llm-hindsight:")


def coach_specs_help(extra: dict[str, str] | None = None) -> str:
    """The coach specs as one help sentence: ``'rule' (what it is); ...`` (``extra``: more, such as ``none``)."""
    items = {**COACH_SPECS, **(extra or {})}
    return "; ".join(f"{name}: {what}" for name, what in items.items())


def coach_from_spec(spec: str, max_tokens: int | None = None) -> Coach:
    """A coach from its spec, one of :data:`COACH_SPECS`: a rule coach by name, ``llm:MODEL@URL``
    (:class:`~mappa_envs.coach.LLMCoach` on an OpenAI-compatible server), ``llm-hindsight:MODEL@URL``
    (:class:`~mappa_envs.coach.llm_hindsight.LLMHindsightCoach`: one call per episode), or
    ``package.module:factory`` (called with no arguments; a coach with ``evaluate_episode`` is a hindsight coach).
    ``max_tokens`` bounds an LLM coach's reply (default 512 tokens a call, 1024 for the hindsight form, which scores
    a whole episode in one reply); it is refused for the other coaches, which generate nothing. ValueError for a
    spec that names no coach, with every spec listed."""
    if max_tokens is not None and not spec.startswith(_LLM_PREFIXES):
        raise ValueError(f"max_tokens is for the LLM coaches ('llm:MODEL@URL', 'llm-hindsight:MODEL@URL'): {spec!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    if spec in _RULE_COACHES:
        return _RULE_COACHES[spec]()
    for prefix in _LLM_PREFIXES:
        if spec.startswith(prefix):
            return _llm_coach(spec[len(prefix) :], hindsight=prefix == "llm-hindsight:", max_tokens=max_tokens)
    if ":" in spec:
        module, _, name = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"coach {spec!r}: no factory {name!r} in module {module!r} ({e})") from None
        return factory()
    raise ValueError(f"unknown coach spec {spec!r}; the specs: " + ", ".join(repr(k) for k in COACH_SPECS))


def _llm_coach(target: str, hindsight: bool, max_tokens: int | None = None) -> Coach:
    """``MODEL@URL`` (an OpenAI-compatible server, e.g. ``vllm serve``; key from ``OPENAI_API_KEY`` or none for a
    local one) or ``MODEL`` (the default OpenAI endpoint)."""
    from .llm import LLMCoach, OpenAIChatBackend
    from .llm_hindsight import LLMHindsightCoach

    model, _, url = target.partition("@")
    if not model:
        raise ValueError(f"an LLM coach needs a model name: 'llm:MODEL@URL', not {target!r}")
    budget = max_tokens if max_tokens is not None else 1024 if hindsight else 512
    backend = OpenAIChatBackend(model, base_url=url or None, max_tokens=budget)
    return LLMHindsightCoach(backend) if hindsight else LLMCoach(backend)


def episode_files(source: str | Path) -> list[Path]:
    """The JSON-lines files of ``source``: a run folder (its ``rollouts/iter-*.jsonl``), a folder of ``*.jsonl``, or
    one file."""
    source = Path(source)
    if source.is_file():
        return [source]
    files = sorted((source / "rollouts").glob("iter-*.jsonl")) or sorted(source.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{source} holds no episodes (rollouts/iter-*.jsonl or *.jsonl)")
    return files


@dataclass
class RescoreStats:
    episodes: int = 0
    actions: int = 0
    calls: int = 0
    """Evaluations asked of the coach in this run."""
    requests: int = 0
    """Coach calls made for them (a hindsight coach makes one per episode)."""
    reused: int = 0
    """Evaluations read back from an earlier, interrupted run, or of an identical action (not asked again)."""
    fallbacks: int = 0


class _EnvMeta:
    """What the coach input needs of an episode's env (roles' tools and guidance, artifacts, task type, template),
    from one probe env per env id, built with the arguments the episodes were made with."""

    def __init__(self, env_kwargs: dict[str, Any]):
        self.env_kwargs, self._probes = env_kwargs, {}

    def inputs(self, record: EpisodeRecord) -> list[CoachInput]:
        import mappa_envs

        if record.env_id not in self._probes:
            env = mappa_envs.make(record.env_id, **self.env_kwargs.get(record.env_id, {}))
            self._probes[record.env_id] = env.unwrapped
            env.close()
        env = self._probes[record.env_id]
        task_type = str(record.metadata.get("task_type", env.task_type))
        last = record.actions[-1].index if record.actions else -1
        out = []
        for act in record.actions:
            role = env.role(act.agent)
            out.append(
                inputs_for_episode(
                    record,
                    act,
                    task_type=task_type,
                    template=env.coach_template,
                    final_agent=env.roles[-1].agent,
                    is_final=act.index == last,  # the wrapper scores the episode's last action knowing it ended
                    artifacts=env.artifacts_for(record) or None,  # the record's own (a ladder level's)
                    tools=role.tools,
                    answers=role.answers,
                    guidance=role.coach_guidance,
                )
            )
        return out


class _Sink:
    """Where a re-score writes: each new evaluation appended to the cache file as soon as it is read (before the
    next action's), each finished episode to the trajectories file."""

    def __init__(self, cache, traj, done: dict[str, CoachEvaluation], name: str):
        self.cache, self.traj, self.done, self.name = cache, traj, done, name
        self.stats, self._lock = RescoreStats(), threading.Lock()

    def keep(self, key: str, ev: CoachEvaluation) -> CoachEvaluation:
        with self._lock:
            self.cache.write(json.dumps({"key": key, "evaluation": ev.to_dict()}) + "\n")
            self.cache.flush()
            self.done[key] = ev
        return ev

    def finish(self, record: EpisodeRecord, keys: list[str], futures: dict[str, Any]) -> None:
        stats = self.stats
        for act, key in zip(record.actions, keys, strict=True):
            if key in futures:
                ev = self.keep(key, futures.pop(key).result())
                stats.calls += 1
            else:  # scored by an earlier, interrupted run (or an identical action)
                ev = self.done[key]
                stats.reused += 1
            stats.fallbacks += ev.fallback_used
            act.info[self.name] = ev.to_dict()
        self.traj.write(record.to_json() + "\n")
        self.traj.flush()
        stats.episodes += 1
        stats.actions += len(record.actions)


def rescore(
    source: str | Path,
    coach: Coach | HindsightCoach,
    out_dir: str | Path,
    *,
    name: str = "rescored",
    env_kwargs: dict[str, dict[str, Any]] | None = None,
    concurrency: int = 8,
    log: Callable[[str], Any] = print,
) -> RescoreStats:
    """Re-score every action of ``source``'s episodes with ``coach`` into ``out_dir`` (see the module docstring).
    ``env_kwargs``: per env id, the arguments its episodes were made with (a run's ``config.json`` gives them).
    Up to ``concurrency`` calls run at once, and as many episodes are in flight (a hindsight coach's one call per
    episode runs alongside others'); episodes are written, and their evaluations kept, in order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache_path, traj_path = out / "evaluations.jsonl", out / "trajectories.jsonl"
    done = _read_cache(cache_path)
    finished = {json.loads(ln)["episode_id"] for ln in _lines(traj_path)}
    meta, pool = _EnvMeta(env_kwargs or {}), CoachPool(coach, max_concurrency=concurrency)
    failed = True
    try:
        with cache_path.open("a", encoding="utf-8") as cache, traj_path.open("a", encoding="utf-8") as traj:
            sink = _Sink(cache, traj, done, name)
            stats = sink.stats
            window: deque[tuple[EpisodeRecord, list[str], dict[str, Any]]] = deque()
            for path in episode_files(source):
                for record in read_jsonl(path):
                    if record.episode_id in finished:  # written whole by an earlier, interrupted run
                        stats.episodes += 1
                        stats.actions += len(record.actions)
                        stats.reused += len(record.actions)
                        continue
                    window.append((record, *_submit(coach, pool, meta.inputs(record), record, done)))
                    if len(window) >= max(1, concurrency):
                        sink.finish(*window.popleft())
            while window:
                sink.finish(*window.popleft())
        failed = False
    finally:
        pool.close(cancel=failed)  # interrupted: the queued calls would be made and then lost
    stats.requests = pool.submitted
    info = {"coach": getattr(coach, "name", type(coach).__name__), "information": information_label(coach)}
    summary = {"source": str(source), "name": name, **info, **asdict(stats)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log(
        f"[rescore] {stats.episodes} episodes, {stats.actions} actions: {stats.calls} evaluations in "
        f"{stats.requests} coach calls, {stats.reused} re-used from an earlier run, {stats.fallbacks} fallbacks "
        f"-> {traj_path}"
    )
    return stats


def _submit(coach: Any, pool: CoachPool, inputs: list[CoachInput], record: EpisodeRecord, done: dict):
    """One episode's evaluations to ask for: (each action's cache key, the futures of those not scored yet)."""
    keys = [inp.key() for inp in inputs]
    if isinstance(coach, HindsightCoach):  # one call sees the whole episode: keyed by it
        keys = [f"hindsight:{_episode_key(keys)}:{i}" for i in range(len(keys))]
        if all(k in done for k in keys):
            return keys, {}
        whole = pool.submit_episode(inputs, record)
        return keys, {k: EpisodePart(whole, i) for i, k in enumerate(keys)}
    return keys, {k: pool.submit(inp) for k, inp in zip(keys, inputs, strict=True) if k not in done}


def _episode_key(keys: list[str]) -> str:
    return hashlib.sha256("|".join(keys).encode()).hexdigest()


def _lines(path: Path) -> list[str]:
    """The complete lines of a file being appended to (a line cut by a kill is left out)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    return [ln for ln in text.split("\n")[: -1 if not text.endswith("\n") else None] if ln.strip()]


def _read_cache(path: Path) -> dict[str, CoachEvaluation]:
    out = {}
    for line in _lines(path):
        row = json.loads(line)
        out[row["key"]] = CoachEvaluation.from_dict(row["evaluation"])
    return out


__all__ = ["RescoreStats", "coach_from_spec", "episode_files", "rescore"]
