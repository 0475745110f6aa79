"""LLM coaches: the coach protocol (:mod:`mappa_envs.coach.protocol`) around any chat backend.

:class:`LLMCoach` retries with exponential backoff and jitter, re-prompts once on a reply without a score, parses
leniently, then falls back to a neutral score that is flagged, never silent; :class:`CoachCache` keys evaluations
by the full coach input (in memory or a JSON-lines file), so re-scoring stored episodes costs no calls.
:class:`OpenAIChatBackend` talks to any OpenAI-compatible server (``vllm serve``, hosted APIs).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any, Protocol

from .coaches import CoachStats
from .guard import GUARD_VERSION
from .protocol import (
    NEUTRAL_SCORE,
    REPROMPT,
    CoachEvaluation,
    CoachInput,
    Templates,
    is_ambiguous,
    parse_answer_correct,
    parse_score,
    parse_score_lenient,
    reasoning_of,
)


class ChatBackend(Protocol):
    name: str

    def complete(self, messages: list[dict[str, str]]) -> str: ...


class OpenAIChatBackend:
    """Any OpenAI-compatible chat server (``vllm serve``, hosted APIs) through the ``openai`` client.

    The API key is read only from the environment variable ``api_key_env`` (local servers accept any value).
    ``extra_body`` is sent with every request as the server's own fields (for ``vllm serve``, constrained decoding:
    ``{"structured_outputs": {"regex": SCORE_REGEX}}``, :data:`~mappa_envs.coach.protocol.SCORE_REGEX`).
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
        extra_body: dict | None = None,
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
        self.extra_body = dict(extra_body or {})
        self.name = f"openai:{model}@{base_url or 'default'}"

    def complete(self, messages: list[dict[str, str]]) -> str:
        r = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            extra_body=self.extra_body or None,
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
        return CoachEvaluation.from_dict({**d, "cached": True})

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
        guard: bool = True,
    ):
        self.backend = backend
        self.templates = templates or Templates()
        self.max_retries = max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.cache = cache
        self.stats = CoachStats()
        self.guard = guard
        """Fence the agents' text and neutralise what addresses the coach (:mod:`mappa_envs.coach.guard`); off only
        to measure what the guard does (the coach's name then says ``unguarded``, so caches never mix the two)."""
        self.name = backend.name if guard else f"{backend.name}+unguarded"
        self.information = ("final-answer-key",)  # the ground truth reaches the final agent's input only
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
        key = f"{self.name}:{GUARD_VERSION if self.guard else 'unguarded'}:{inp.key()}"
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            self.stats.add(cache_hits=1)
            return hit
        start = time.perf_counter()
        self.stats.add(calls=1)
        messages, findings = self.templates.build_guarded(inp)  # what addresses the coach is flagged either way
        if not self.guard:
            messages = self.templates.build(inp)
        reply, retries, error = self._call(messages)
        ev = CoachEvaluation(score=NEUTRAL_SCORE, backend=self.name, retries=retries)
        ev.coach_directed_text = list(findings.kinds)
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
        ev.score_echoed = not ev.fallback_used and findings.echoed(ev.score)
        if ev.fallback_used:
            self.stats.add(fallbacks=1)
        if ev.ambiguous:
            self.stats.add(ambiguous=1)
        self.stats.add(coach_directed=bool(findings.kinds), score_echoed=ev.score_echoed)
        ev.latency_s = time.perf_counter() - start
        if self.cache is not None and not ev.fallback_used:
            self.cache.put(key, ev)
        return ev


__all__ = ["ChatBackend", "CoachCache", "LLMCoach", "OpenAIChatBackend"]
