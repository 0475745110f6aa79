"""An LLM hindsight coach: one call per finished episode, one score per action (issue 20's protocol extension).

The coach is shown the whole episode (every action with its tool feedback, the workspace's files, the outcome) and
replies with one ``PROCESS_SCORE[i]: s`` line per action index (:func:`~mappa_envs.coach.hindsight.
parse_hindsight_scores`). The per-action coach's rules apply per index: a reply missing some indices gets one
re-prompt naming them; an index still missing is read leniently in the re-prompt's reply (``action 2: 7/10``,
``[2] 7``); what is still missing falls back to the neutral score, flagged on that action only (``fallback_used``,
``fallback_reason``).
Templates: ``hindsight_system.txt``, ``hindsight_user.txt`` and ``hindsight_action.txt`` (your own copies with
``templates_dir=``, as for :class:`~mappa_envs.coach.LLMCoach`).

>>> _lenient_scores("Action 0: 7/10\\n[1] 3\\n10", 3)
[7.0, 3.0, None]
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence

from ..core import EpisodeRecord, truncate_middle
from .guard import FENCE_NOTE, GUARD_VERSION, Findings, guard, new_fence
from .hindsight import parse_hindsight_scores
from .llm import ChatBackend, CoachCache, LLMCoach
from .protocol import NEUTRAL_SCORE, CoachEvaluation, CoachInput, Templates, clamp, reasoning_of

_LENIENT = re.compile(
    r"(?:action|step|PROCESS_SCORE)?\s*\[?\s*(\d+)\s*(?:\]\s*[:=-]?|[:=)-]|\s)\s*(?:score\s*[:=]?\s*)?"
    r"(\d+(?:\.\d+)?)\s*(?:/\s*10)?",
    re.IGNORECASE,
)
REPROMPT = (
    "Your reply has no readable score for action(s) {missing}. Reply with one line `PROCESS_SCORE[i]: <0-10>` for "
    "each of them, and nothing else."
)


def _lenient_scores(reply: str, n: int) -> list[float | None]:
    """Per index, a score written another way on a line of its own (``Action 2: 7/10``, ``[2] 7``); None where
    no line names the index."""
    out: list[float | None] = [None] * n
    for line in reply.splitlines():
        m = _LENIENT.fullmatch(line.strip().strip("*-. "))
        if m and int(m.group(1)) < n:
            out[int(m.group(1))] = clamp(float(m.group(2)))
    return out


class LLMHindsightCoach:
    """One chat call per episode through ``backend``; retries with backoff as :class:`LLMCoach` (the same
    ``max_retries``/``backoff_s``), an optional :class:`CoachCache` keyed by the whole episode's inputs."""

    def __init__(
        self,
        backend: ChatBackend,
        templates: Templates | None = None,
        *,
        max_chars: int = 1500,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        cache: CoachCache | None = None,
        guard: bool = True,
    ):
        self._llm = LLMCoach(backend, templates, max_retries=max_retries, backoff_s=backoff_s, guard=guard)
        self.templates, self.stats, self.cache = self._llm.templates, self._llm.stats, cache
        self.max_chars = max_chars
        self.guard = guard
        """As :attr:`LLMCoach.guard`: each action's text fenced and stripped of what addresses the coach."""
        self.name = f"hindsight:{self._llm.name}"
        self.information = ("outcome", "per-action-answer-key")  # the episode, its outcome and the right answer

    def build(self, inputs: Sequence[CoachInput], record: EpisodeRecord) -> list[dict[str, str]]:
        """The chat messages: the system prompt and the episode, each action shortened to ``max_chars`` (guarded
        when :attr:`guard` is on)."""
        return self.build_guarded(inputs, record, guarded=self.guard)[0]

    def build_guarded(
        self, inputs: Sequence[CoachInput], record: EpisodeRecord, guarded: bool = True
    ) -> tuple[list[dict[str, str]], list[Findings]]:
        """The chat messages and, per action, what addresses the coach in its text (found either way; fenced with
        a fresh token and neutralised only when ``guarded``: :mod:`mappa_envs.coach.guard`)."""
        t = self.templates
        token = new_fence()
        found = [Findings() for _ in inputs]
        shared = Findings()  # the workspace's file names: every action's author may have chosen one

        def agent_text(text: str, findings: Findings) -> str:
            clean = guard(text, token, findings)
            return clean if guarded else text

        action = t.read("hindsight_action.txt") or ""
        blocks = []
        for i, inp in enumerate(inputs):
            guidance = inp.role_guidance or t.role_guidance(inp.template, inp.role)
            blocks.append(
                action.format(
                    index=i,
                    role=inp.role.replace("_", " "),
                    agent=inp.agent,
                    turn=inp.turn,
                    role_description=guidance.splitlines()[0] if guidance else "",
                    output=agent_text(truncate_middle(inp.output, self.max_chars) or "(empty reply)", found[i]),
                    tool_feedback=agent_text(
                        truncate_middle(inp.tool_feedback, self.max_chars // 2) or "no tools used", found[i]
                    ),
                )
            )
        last = inputs[-1] if inputs else None
        files = "\n".join(f"- {f.path} ({f.size} bytes, written by {f.written_by or 'the task'})" for f in last.files)
        ending = f"{'succeeded' if record.success else 'failed'}"
        if record.ground_truth is not None:
            ending += f"; the right answer: {record.ground_truth}"
        if record.outcome:
            ending += "; " + ", ".join(f"{k}={v}" for k, v in record.outcome.items() if k != "summary")
        user = (t.read("hindsight_user.txt") or "").format(
            task=truncate_middle(last.task, 4 * self.max_chars),
            actions="\n".join(blocks),
            files=agent_text(files, shared) if files else "(none)",
            outcome=agent_text(ending, found[-1]) if found else ending,  # it quotes the final answer
            last=len(inputs) - 1,
        )
        for inp, findings in zip(inputs, found, strict=True):  # a file's name is its writer's text
            if shared.kinds and any(f.written_by == inp.agent for f in last.files):
                findings.add(shared)
        system = (t.read("hindsight_system.txt") or "").strip()
        if guarded:
            system += "\n\n" + FENCE_NOTE.format(token=token)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], found

    def _ask(self, messages: list[dict[str, str]], n: int):
        """The call, one re-prompt naming the indices without a score, then the lenient reading: (scores, how each
        was read, the whole reply or None, retries, re-prompted, why a score is missing)."""
        reply, retries, error = self._llm._call(messages)
        scores: list[float | None] = [None] * n
        parse = ["strict"] * n
        if reply is None:
            return scores, parse, None, retries, False, f"coach unreachable after {retries} retries ({error})"
        scores, _ = parse_hindsight_scores(reply, n)
        missing = [i for i, s in enumerate(scores) if s is None]
        if missing:
            self.stats.add(reprompts=1)
            again = [*messages, {"role": "assistant", "content": reply}]
            again.append({"role": "user", "content": REPROMPT.format(missing=", ".join(map(str, missing)))})
            second, more, error = self._llm._call(again)
            retries += more
            if second is not None:
                reply = f"{reply}\n\n[re-prompt]\n{second}"
                got, _ = parse_hindsight_scores(second, n)
                for i in [i for i in missing if got[i] is not None]:
                    scores[i], parse[i] = got[i], "reprompt"
                # read leniently only in the reply that was asked for nothing but scores (the first one's reasoning
                # may hold numbered lists and ranges)
                lenient = _lenient_scores(second, n)
                for i in [i for i in missing if scores[i] is None and lenient[i] is not None]:
                    scores[i], parse[i] = lenient[i], "lenient"
                    self.stats.add(lenient=1)
        why = "no score for this action in the reply, after one re-prompt" + (f" ({error})" if error else "")
        return scores, parse, reply, retries, bool(missing), why

    def evaluate_episode(self, inputs: Sequence[CoachInput], record: EpisodeRecord) -> list[CoachEvaluation]:
        if not inputs:
            return []
        version = GUARD_VERSION if self.guard else "unguarded"  # no evaluation cached under other prompts re-used
        key = f"{self.name}:{version}:" + hashlib.sha256("|".join(i.key() for i in inputs).encode()).hexdigest()
        cached = [self.cache.get(f"{key}:{i}") for i in range(len(inputs))] if self.cache is not None else [None]
        if None not in cached:
            self.stats.add(cache_hits=len(inputs))
            return cached
        start = time.perf_counter()
        self.stats.add(calls=1)
        messages, found = self.build_guarded(inputs, record, guarded=self.guard)
        scores, parse, reply, retries, reprompted, why = self._ask(messages, len(inputs))
        self.stats.add(retries=retries)
        out = []
        for i, score in enumerate(scores):
            ev = CoachEvaluation(
                score=NEUTRAL_SCORE if score is None else score,
                reasoning=reasoning_of(reply) if reply else "",
                raw_reply=reply or "",
                backend=self.name,
                latency_s=(time.perf_counter() - start) / len(inputs),
                retries=retries,
                reprompted=reprompted,
                parse="fallback" if score is None else parse[i],
                fallback_used=score is None,
                fallback_reason=why if score is None else None,
                coach_directed_text=list(found[i].kinds),
                score_echoed=score is not None and found[i].echoed(score),
            )
            self.stats.add(coach_directed=bool(found[i].kinds), score_echoed=ev.score_echoed)
            if ev.fallback_used:
                self.stats.add(fallbacks=1)
            elif self.cache is not None:
                self.cache.put(f"{key}:{i}", ev)
            out.append(ev)
        return out


__all__ = ["LLMHindsightCoach"]
