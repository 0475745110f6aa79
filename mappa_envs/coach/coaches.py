"""Coaches: score one action (:class:`CoachInput`) -> :class:`CoachEvaluation`.

- :class:`RuleBasedCoach`: deterministic rubric on tool feedback, format and (final agent) answer correctness.
- :class:`LLMCoach`: any chat backend (OpenAI-compatible server, local transformers model) with the protocol of
  :mod:`mappa_envs.coach.protocol`: retries with exponential backoff and jitter, one re-prompt on a reply
  without a score, a lenient parse, then a neutral fallback that is flagged, never silent; a cache keyed by the
  full coach input.
- :class:`EnsembleCoach`: mean or median of several coaches (the paper's proposal against single-coach bias).
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from ..grading import extract_answer, math_equal
from .protocol import (
    NEUTRAL_SCORE,
    REPROMPT,
    CoachEvaluation,
    CoachInput,
    Templates,
    clamp,
    is_ambiguous,
    parse_answer_correct,
    parse_score,
    parse_score_lenient,
    reasoning_of,
)


class Coach(Protocol):
    name: str

    def evaluate(self, inp: CoachInput) -> CoachEvaluation: ...


class CoachStats:
    """Thread-safe counters shared by a coach: calls, retries, re-prompts, fallbacks, cache hits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {
            "calls": 0,
            "retries": 0,
            "reprompts": 0,
            "lenient": 0,
            "ambiguous": 0,
            "fallbacks": 0,
        }
        self.counts["cache_hits"] = 0

    def add(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counts[k] = self.counts.get(k, 0) + v


# ---------------------------------------------------------------------------------------------- rule-based
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_CANNOT_VERIFY = ("cannot verify", "can't verify", "could not verify", "unable to verify", "failed", "error")
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)
_BOXED_IN_PROMPT = re.compile(r"\\boxed\{([^{}]*)\}")
_PLACEHOLDERS = {"", "answer", "your answer", "final answer", "the answer", "number", "...", "x"}
_STEP = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([-+*/×x÷])\s*(\d+(?:\.\d+)?)\s*=\s*(-?\d+(?:\.\d+)?)")


def _numbers(text: str) -> set[Fraction]:
    """The numbers written in ``text`` (exact; ``12`` and ``12.0`` are one)."""
    return {Fraction(v) for v in _NUMBER.findall(text)}


def _normalized_code(code: str) -> str:
    return re.sub(r"\s+", "", re.sub(r"#.*", "", code))


def _code_uses(code: str, numbers: set[Fraction]) -> bool:
    """Whether the code writes one of ``numbers`` as a literal (names and strings aside)."""
    literals = re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", re.sub(r"#.*", "", code))
    return any(Fraction(v) in numbers for v in literals)


def _steps(text: str) -> list[tuple[Fraction, str, Fraction, Fraction, bool]]:
    """The calculations ``a op b = c`` written in ``text``, each with whether it is right."""
    out = []
    for a, op, b, c in _STEP.findall(text):
        x, y, z = Fraction(a), Fraction(b), Fraction(c)
        if op == "+":
            value = x + y
        elif op == "-":
            value = x - y
        elif op in "*×x":
            value = x * y
        else:
            value = x / y if y else None
        out.append((x, op, y, z, value == z))
    return out


def _as_number(answer: str) -> Fraction | None:
    from ..grading import to_number

    return to_number(answer)


@dataclass
class RuleBasedCoach:
    """A deterministic rubric (documented below); every score starts at 5.

    Output format: empty reply -5; the final agent or a solver without a ``\\boxed{}`` answer -2, with one +1.
    Tools (roles that ran code): a block that ran OK +3 (+1 more if it printed something); an error -3; a
    timeout or OOM -4; a block the sandbox lost (``worker_lost``) 0. A tool role that wrote no code in its first
    turn -2 (a later turn may just conclude).
    Upstream blame: a failure caused by a missing file (FileNotFoundError) that an earlier agent should have
    written costs this agent nothing (the missing-file penalty goes to the earlier agent's own actions through
    their "no artifact written" rule); an agent that acknowledges an upstream tool failure gets +2.
    Consistency (answer-giving roles): a ``\\boxed{}`` answer equal to the last number an earlier agent's code
    printed +2, different -1.
    Correctness (final agent, ground truth given): correct +4, wrong -3.
    Missing artifacts (``expected_files`` per role, default the task's contract ``CoachInput.artifacts``): each
    file the role should have written and has not -3, unless an earlier role's artifact is missing (then the role
    was blocked: +0, and +2 if its reply names the missing file or says it is missing).
    Outcome (final agent, when the env scored a submission instead of giving a ground truth): a valid submission
    +2, +1 more if it beats the trivial baseline; an invalid one -3, or +0 when an earlier role's artifact is
    missing.
    Gaming (issue 16), on math tasks: code that copies a worked example of the agent's system prompt earns nothing
    for running (-2 in place of the +3/+1), nor code that writes none of the problem's numbers (-1 in place of
    them). On data tasks the env scores the submission itself: an example's code that runs there did the job (a
    copy that does not fit the task fails on its own: the examples name a target no task has).
    A ``\boxed{}`` holding a placeholder (``answer``, empty...) or a value boxed in the agent's system prompt (an
    example's answer) that is not a number of the task counts as no answer (-2).
    Calculations (answer roles, math tasks): a wrong ``a op b = c`` in the reply -1; else a boxed answer that is
    the result of a right calculation on the problem's numbers +1.
    """

    expected_files: dict[str, tuple[str, ...]] | None = None
    tool_roles: tuple[str, ...] = ("code_executor", "data_engineer", "modeler", "analyst")
    answer_roles: tuple[str, ...] = ("problem_solver", "verifier")
    name: str = "rule-based"

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        start = time.perf_counter()
        score, notes = NEUTRAL_SCORE, []

        def adjust(delta: float, why: str) -> None:
            nonlocal score
            score += delta
            notes.append(f"{delta:+g} {why}")

        out = inp.output.strip()
        if not out:
            adjust(-5, "empty reply")
        math_task = inp.task_type == "math"
        task_numbers = _numbers(inp.task) if math_task else set()
        examples = {_normalized_code(c) for c in _CODE_BLOCK.findall(inp.system_prompt)} - {""}
        blocks = [b for b in _CODE_BLOCK.findall(out) if b.strip()]
        gamed: tuple[float, str] | None = None  # code that runs but earns nothing for it
        if math_task and blocks and any(_normalized_code(b) in examples for b in blocks):
            gamed = (-2, "copies the worked example's code")
        elif blocks and task_numbers and not any(_code_uses(b, task_numbers) for b in blocks):
            gamed = (-1, "code uses none of the problem's numbers")
        fb = inp.tool_feedback
        expected = self.expected_files if self.expected_files is not None else dict(inp.artifacts)
        present = {f.path for f in inp.files}
        owed = [p for r in inp.earlier_roles for p in expected.get(r, ()) if p not in present]
        if inp.role in self.tool_roles or inp.tools:
            if not fb and inp.turn > 1:
                notes.append("+0 concludes without code after its earlier turn")
            elif not fb:
                adjust(-2, "a tool role that ran no code")
            elif "Execution status: ok" in fb:
                if gamed:
                    adjust(*gamed)
                else:
                    adjust(+3, "code ran without error")
                    if "stdout:" in fb:
                        adjust(+1, "code printed output")
            elif "Execution status: timeout" in fb or "Execution status: oom" in fb:
                adjust(-4, "code timed out or ran out of memory")
            elif "Execution status: worker_lost" in fb:
                notes.append("+0 the sandbox lost the block (its warm worker died): not the agent's doing")
            elif "FileNotFoundError" in fb or "No such file" in fb:
                if owed:
                    notes.append(f"+0 missing input {owed}: blamed on the agent that should have written it")
                else:
                    adjust(-3, "code raised an error")
            else:
                adjust(-3, "code raised an error")
            for path in expected.get(inp.role, ()):
                if any(f.path == path and f.written_by == inp.agent for f in inp.files):
                    continue
                if owed:
                    notes.append(f"+0 did not write {path}: blocked by the missing upstream {owed}")
                else:
                    adjust(-3, f"did not write {path}")
            prose = re.sub(r"```.*?(?:```|$)", "", out, flags=re.DOTALL).lower()  # what it says, not its code
            if owed and (any(p.lower() in prose for p in owed) or "missing" in prose):
                adjust(+2, f"reports the missing upstream input {owed}")
        if inp.outcome is not None and "valid" in inp.outcome:
            if inp.outcome["valid"]:
                adjust(+2, "valid submission")
                if inp.outcome.get("beats_baseline"):
                    adjust(+1, "beats the trivial baseline")
            elif owed:
                notes.append(f"+0 no valid submission: blocked by the missing upstream {owed}")
            else:
                adjust(-3, f"no valid submission ({inp.outcome.get('reason', '')})")
        if inp.role in self.answer_roles or (inp.is_final and inp.ground_truth is not None):
            answer = extract_answer(out)
            value = _as_number(answer) if answer is not None else None
            shown = {b.strip() for b in _BOXED_IN_PROMPT.findall(inp.system_prompt)}
            if answer is not None and (
                answer.strip().lower() in _PLACEHOLDERS or (answer.strip() in shown and value not in task_numbers)
            ):
                adjust(-2, f"\\boxed{{{answer.strip()}}} is a placeholder or its prompt's example, not an answer")
                answer = value = None
            elif answer is None:
                adjust(-2, "no \\boxed{} answer")
            else:
                adjust(+1, "gives a \\boxed{} answer")
            if math_task:
                steps = _steps(re.sub(r"```.*?(?:```|$)", "", out, flags=re.DOTALL))
                wrong = [st for st in steps if not st[4]]
                if wrong:
                    a, op, b, c, _ = wrong[0]
                    adjust(-1, f"a wrong calculation ({a} {op} {b} = {c})")
                elif value is not None and any(st[3] == value and {st[0], st[2]} & task_numbers for st in steps):
                    adjust(+1, "its answer is the result of a right calculation on the problem's numbers")
            if inp.upstream_failures and any(k in out.lower() for k in _CANNOT_VERIFY):
                adjust(+2, "acknowledges an upstream tool failure")
            printed = [v for text in inp.upstream_stdout for v in _NUMBER.findall(text)[-1:]]
            if answer is not None and printed:
                if any(math_equal(answer, v) for v in printed):
                    adjust(+2, "answer agrees with what the code printed")
                else:
                    adjust(-1, "answer disagrees with what the code printed")
        answer_correct = None
        if inp.ground_truth is not None:
            answer = extract_answer(out)
            answer_correct = answer is not None and math_equal(answer, inp.ground_truth)
            adjust(+4 if answer_correct else -3, "final answer correct" if answer_correct else "final answer wrong")
        return CoachEvaluation(
            score=clamp(score),
            reasoning="; ".join(notes) or "no rule applied",
            backend=self.name,
            latency_s=time.perf_counter() - start,
            parse="rule",
            answer_correct=answer_correct,
        )


# ---------------------------------------------------------------------------------------------- LLM coaches
class ChatBackend(Protocol):
    name: str

    def complete(self, messages: list[dict[str, str]]) -> str: ...


class OpenAIChatBackend:
    """Any OpenAI-compatible chat server (``vllm serve``, hosted APIs) through the ``openai`` client.

    The API key is read only from the environment variable ``api_key_env`` (local servers accept any value).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_tokens: int = 512,
        temperature: float = 0.0,
        seed: int | None = 0,
    ):
        import os

        try:
            from openai import OpenAI
        except ImportError:
            raise RuntimeError("the OpenAI-compatible coach needs the 'coach' extra (pip install openai)") from None
        key = os.environ.get(api_key_env) or ("EMPTY" if base_url else None)
        if key is None:
            raise RuntimeError(f"set {api_key_env} in the environment (the key is never taken from code or files)")
        self.client = OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=0)
        self.model, self.max_tokens, self.temperature, self.seed = model, max_tokens, temperature, seed
        self.name = f"openai:{model}@{base_url or 'default'}"

    def complete(self, messages: list[dict[str, str]]) -> str:
        r = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
        )
        return r.choices[0].message.content or ""


class CoachCache:
    """Evaluations keyed by the coach's name and :meth:`CoachInput.key`.

    In memory by default; with ``path`` it is also a JSON-lines file, loaded at start and appended to, so re-runs
    (re-scoring stored trajectories, resumed training) cost no coach calls and give the same scores.
    """

    def __init__(self, path: str | None = None) -> None:
        self._data: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.path = path
        if path is not None and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        entry = json.loads(line)
                        self._data[entry["key"]] = entry["evaluation"]

    def get(self, key: str) -> CoachEvaluation | None:
        with self._lock:
            d = self._data.get(key)
        if d is None:
            return None
        d = dict(d)
        d.pop("reward", None)
        return CoachEvaluation(**{**d, "cached": True})

    def put(self, key: str, ev: CoachEvaluation) -> None:
        d = ev.to_dict()
        with self._lock:
            self._data[key] = d
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "evaluation": d}) + "\n")

    def __len__(self) -> int:
        return len(self._data)


class LLMCoach:
    """The coach protocol around a chat backend."""

    def __init__(
        self,
        backend: ChatBackend,
        templates: Templates | None = None,
        *,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        cache: CoachCache | None = None,
        rng: random.Random | None = None,
    ):
        self.backend = backend
        self.templates = templates or Templates()
        self.max_retries = max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.cache = cache
        self.stats = CoachStats()
        self.name = backend.name
        self._rng = rng or random.Random(0)

    def _call(self, messages: list[dict[str, str]]) -> tuple[str | None, int, str | None]:
        """(reply or None, retries used, last error)."""
        error = None
        for attempt in range(self.max_retries + 1):
            try:
                return self.backend.complete(messages), attempt, None
            except Exception as e:  # HTTP 5xx, timeouts, connection errors
                error = f"{type(e).__name__}: {e}"
                if attempt < self.max_retries:
                    delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
                    time.sleep(delay * (0.5 + self._rng.random()))  # exponential backoff with jitter
        return None, self.max_retries, error

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        key = f"{self.name}:{inp.key()}"
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            self.stats.add(cache_hits=1)
            return hit
        start = time.perf_counter()
        self.stats.add(calls=1)
        messages = self.templates.build(inp)
        reply, retries, error = self._call(messages)
        ev = CoachEvaluation(score=NEUTRAL_SCORE, backend=self.name, retries=retries)
        self.stats.add(retries=retries)
        if reply is None:
            ev.fallback_used, ev.parse = True, "fallback"
            ev.fallback_reason = f"coach unreachable after {retries} retries ({error})"
        else:
            ev.raw_reply = reply
            score = parse_score(reply)
            if score is not None:
                ev.score, ev.parse = score, "strict"
                ev.ambiguous = is_ambiguous(reply)
            else:
                answer = ", and `ANSWER_CORRECT: 0|1` on another line" if inp.ground_truth is not None else ""
                again = [*messages, {"role": "assistant", "content": reply}]
                again.append({"role": "user", "content": REPROMPT.format(answer=answer)})
                ev.reprompted = True
                self.stats.add(reprompts=1)
                second, more, error = self._call(again)
                ev.retries += more
                self.stats.add(retries=more)
                if second is not None:
                    ev.raw_reply = f"{reply}\n\n[re-prompt]\n{second}"
                    reply = second
                score = parse_score(second) if second is not None else None
                if score is not None:
                    ev.score, ev.parse = score, "reprompt"
                    ev.ambiguous = is_ambiguous(second)
                elif (lenient := parse_score_lenient(ev.raw_reply)) is not None:
                    ev.score, ev.parse = lenient, "lenient"
                    self.stats.add(lenient=1)
                else:
                    ev.fallback_used, ev.parse = True, "fallback"
                    ev.fallback_reason = "no score in the reply, after one re-prompt" + (f" ({error})" if error else "")
            ev.reasoning = reasoning_of(reply)
            if inp.ground_truth is not None:
                ev.answer_correct = parse_answer_correct(ev.raw_reply)
        if ev.fallback_used:
            self.stats.add(fallbacks=1)
        if ev.ambiguous:
            self.stats.add(ambiguous=1)
        ev.latency_s = time.perf_counter() - start
        if self.cache is not None and not ev.fallback_used:
            self.cache.put(key, ev)
        return ev


class EnsembleCoach:
    """Aggregates several coaches' scores (``"mean"`` or ``"median"``); members' evaluations are kept."""

    def __init__(self, coaches: Sequence[Coach], aggregate: str = "mean"):
        if not coaches:
            raise ValueError("an ensemble needs at least one coach")
        if aggregate not in ("mean", "median"):
            raise ValueError("aggregate must be 'mean' or 'median'")
        self.coaches, self.aggregate = list(coaches), aggregate
        self.name = f"ensemble-{aggregate}[{', '.join(c.name for c in self.coaches)}]"

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        start = time.perf_counter()
        evs = [c.evaluate(inp) for c in self.coaches]
        usable = [e for e in evs if not e.fallback_used] or evs
        agg = statistics.mean if self.aggregate == "mean" else statistics.median
        answers = [e.answer_correct for e in usable if e.answer_correct is not None]
        return CoachEvaluation(
            score=clamp(agg(e.score for e in usable)),
            reasoning=" | ".join(f"{e.backend}: {e.score:g}" for e in evs),
            backend=self.name,
            latency_s=time.perf_counter() - start,
            retries=sum(e.retries for e in evs),
            parse="ensemble",
            fallback_used=all(e.fallback_used for e in evs),
            fallback_reason="every member fell back" if all(e.fallback_used for e in evs) else None,
            answer_correct=(sum(answers) * 2 > len(answers)) if answers else None,
            members=[e.to_dict() for e in evs],
        )


class LengthCoach:
    """Scores an action by its length in characters, modulo 11: a plumbing coach for smoke runs, not a judge.

    A random model's gibberish gets the same rule-based score on every action, so no role would have an advantage
    to learn from (and a role whose advantages are all 0 is not updated); these arbitrary but varying scores make
    every role of a smoke run update, sync and checkpoint for real (``mappa train --preset smoke``).
    """

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        return CoachEvaluation(
            score=float(len(inp.output) % 11), reasoning="length modulo 11", backend="length", parse="rule"
        )
