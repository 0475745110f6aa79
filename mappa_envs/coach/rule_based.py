"""The rule-based coach: a deterministic rubric on tool feedback, format, artifacts and (final agent) correctness.

It needs no model and no network: the demo's coach, the fallback of experiments without a coach server, and the
reference against which LLM coaches are compared (:mod:`mappa_envs.coach.bias`). Its rules are in
:class:`RuleBasedCoach`'s docstring; tests/test_rubric_gaming.py checks them against gaming.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from fractions import Fraction

from ..core.text import PYTHON_FENCES, fenced_blocks, prose
from ..grading import extract_answer, math_equal
from .protocol import NEUTRAL_SCORE, CoachEvaluation, CoachInput, clamp

# a program's own report of a file it could not open (Python's exception, the C library's message)
_MISSING_FILE = re.compile(r"FileNotFoundError|No such file")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_CANNOT_VERIFY = ("cannot verify", "can't verify", "could not verify", "unable to verify", "failed", "error")
_BOXED_IN_PROMPT = re.compile(r"\\boxed\{([^{}]*)\}")
_PLACEHOLDERS = {"", "answer", "your answer", "final answer", "the answer", "number", "...", "x"}
_STEP = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([-+*/×x÷])\s*(\d+(?:\.\d+)?)\s*=\s*(-?\d+(?:\.\d+)?)")


def _any_code(text: str) -> list[str]:
    """Every code block of ``text`` for the copy and relevance rules: closed or cut off at the end, tagged python or
    untagged (code that never ran still shows what the role wrote)."""
    blocks, left_open = fenced_blocks(text, *PYTHON_FENCES, untagged=True)
    return [*blocks, left_open] if left_open and left_open.strip() else blocks


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
    A ``\\boxed{}`` holding a placeholder (``answer``, empty...) or a value boxed in the agent's system prompt (an
    example's answer) that is not a number of the task counts as no answer (-2).
    Calculations (answer roles, math tasks): a wrong ``a op b = c`` in the reply -1; else a boxed answer that is
    the result of a right calculation on the problem's numbers +1.
    """

    expected_files: dict[str, tuple[str, ...]] | None = None
    tool_roles: tuple[str, ...] = ()
    """Roles scored on tool use besides those the task gives tools (``Role.tools``)."""
    answer_roles: tuple[str, ...] = ()
    """Roles scored on their answer besides those the task declares answering (``Role.answers``) and the final
    agent of a task with a ground truth."""
    name: str = "rule-based"
    information: tuple[str, ...] = ("final-answer-key",)
    """What it sees (:mod:`mappa_envs.coach.information`): the ground truth for the final agent's answer only."""

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        start = time.perf_counter()
        card = _Scorecard()
        out = inp.output.strip()
        if not out:
            card.adjust(-5, "empty reply")
        expected = self.expected_files if self.expected_files is not None else dict(inp.artifacts)
        present = {f.path for f in inp.files}
        owed = [p for r in inp.earlier_roles for p in expected.get(r, ()) if p not in present]
        if inp.tools or inp.role in self.tool_roles:
            self._tool_rules(inp, out, expected, owed, card)
        if inp.outcome is not None and "valid" in inp.outcome:
            _outcome_rules(inp, owed, card)
        if inp.answers or inp.role in self.answer_roles or (inp.is_final and inp.ground_truth is not None):
            _answer_rules(inp, out, card)
        answer_correct = None
        if inp.ground_truth is not None:
            answer = extract_answer(out)
            answer_correct = answer is not None and math_equal(answer, inp.ground_truth)
            card.adjust(+4, "final answer correct") if answer_correct else card.adjust(-3, "final answer wrong")
        return CoachEvaluation(
            score=clamp(card.score),
            reasoning="; ".join(card.notes) or "no rule applied",
            backend=self.name,
            latency_s=time.perf_counter() - start,
            parse="rule",
            answer_correct=answer_correct,
        )

    def _tool_rules(
        self, inp: CoachInput, out: str, expected: dict[str, tuple[str, ...]], owed: list[str], card: _Scorecard
    ) -> None:
        """A tool role: how its code ran, the artifacts it owed, and whether it reported a missing input."""
        status = set(inp.tool_status)  # the calls' execution statuses (sandboxes.ExecStatus), not feedback text
        if not status and inp.turn > 1:
            card.note("+0 concludes without code after its earlier turn")
        elif not status:
            card.adjust(-2, "a tool role that ran no code")
        elif status == {"ok"}:
            gamed = _gaming(inp, out)
            if gamed:
                card.adjust(*gamed)
            else:
                card.adjust(+3, "code ran without error")
                if any(inp.tool_stdout):
                    card.adjust(+1, "code printed output")
        elif status & {"timeout", "oom"}:
            card.adjust(-4, "code timed out or ran out of memory")
        elif "worker_lost" in status:
            card.note("+0 the sandbox lost the block (its warm worker died): not the agent's doing")
        elif owed and any(_MISSING_FILE.search(e) for e in inp.tool_stderr):
            card.note(f"+0 missing input {owed}: blamed on the agent that should have written it")
        else:
            card.adjust(-3, "code raised an error")
        for path in expected.get(inp.role, ()):
            if any(f.path == path and f.written_by == inp.agent for f in inp.files):
                continue
            if owed:
                card.note(f"+0 did not write {path}: blocked by the missing upstream {owed}")
            else:
                card.adjust(-3, f"did not write {path}")
        said = prose(out).lower()  # what it says, not its code
        if owed and (any(p.lower() in said for p in owed) or "missing" in said):
            card.adjust(+2, f"reports the missing upstream input {owed}")


class _Scorecard:
    """A score from :data:`NEUTRAL_SCORE` and the notes of every rule that moved it (or deliberately did not)."""

    def __init__(self) -> None:
        self.score, self.notes = NEUTRAL_SCORE, []

    def adjust(self, delta: float, why: str) -> None:
        self.score += delta
        self.notes.append(f"{delta:+g} {why}")

    def note(self, text: str) -> None:
        self.notes.append(text)


def _gaming(inp: CoachInput, out: str) -> tuple[float, str] | None:
    """On a math task, code that runs but earns nothing for it: a copy of a worked example, or code that writes none
    of the problem's numbers (the adjustment in place of the +3/+1)."""
    if inp.task_type != "math":
        return None
    blocks = _any_code(out)
    examples = {_normalized_code(c) for c in _any_code(inp.system_prompt)} - {""}
    if blocks and any(_normalized_code(b) in examples for b in blocks):
        return (-2, "copies the worked example's code")
    task_numbers = _numbers(inp.task)
    if blocks and task_numbers and not any(_code_uses(b, task_numbers) for b in blocks):
        return (-1, "code uses none of the problem's numbers")
    return None


def _outcome_rules(inp: CoachInput, owed: list[str], card: _Scorecard) -> None:
    """The env scored a submission (DSBench): valid, beats the trivial baseline, or invalid (blocked or not)."""
    assert inp.outcome is not None
    if inp.outcome["valid"]:
        card.adjust(+2, "valid submission")
        if inp.outcome.get("beats_baseline"):
            card.adjust(+1, "beats the trivial baseline")
    elif owed:
        card.note(f"+0 no valid submission: blocked by the missing upstream {owed}")
    else:
        card.adjust(-3, f"no valid submission ({inp.outcome.get('reason', '')})")


def _answer_rules(inp: CoachInput, out: str, card: _Scorecard) -> None:
    """An answer-giving role: a real ``\\boxed{}`` answer, right calculations, agreement with the code's output."""
    task_numbers = _numbers(inp.task) if inp.task_type == "math" else set()
    answer = extract_answer(out)
    value = _as_number(answer) if answer is not None else None
    shown = {b.strip() for b in _BOXED_IN_PROMPT.findall(inp.system_prompt)}
    if answer is not None and (
        answer.strip().lower() in _PLACEHOLDERS or (answer.strip() in shown and value not in task_numbers)
    ):
        card.adjust(-2, f"\\boxed{{{answer.strip()}}} is a placeholder or its prompt's example, not an answer")
        answer = value = None
    elif answer is None:
        card.adjust(-2, "no \\boxed{} answer")
    else:
        card.adjust(+1, "gives a \\boxed{} answer")
    if inp.task_type == "math":
        steps = _steps(prose(out))
        wrong = [st for st in steps if not st[4]]
        if wrong:
            a, op, b, c, _ = wrong[0]
            card.adjust(-1, f"a wrong calculation ({a} {op} {b} = {c})")
        elif value is not None and any(st[3] == value and {st[0], st[2]} & task_numbers for st in steps):
            card.adjust(+1, "its answer is the result of a right calculation on the problem's numbers")
    if inp.upstream_failures and any(k in out.lower() for k in _CANNOT_VERIFY):
        card.adjust(+2, "acknowledges an upstream tool failure")
    printed = [v for text in inp.upstream_stdout for v in _NUMBER.findall(text)[-1:]]
    if answer is not None and printed:
        if any(math_equal(answer, v) for v in printed):
            card.adjust(+2, "answer agrees with what the code printed")
        else:
            card.adjust(-1, "answer disagrees with what the code printed")


__all__ = ["RuleBasedCoach"]
