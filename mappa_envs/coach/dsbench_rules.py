"""A DSBench rule coach that credits partial progress: how far each code block got, which hand-over files this
action delivered and whether the env's own check of them found them usable, how close a submission came to valid.

The general :class:`~mappa_envs.coach.RuleBasedCoach` charges a fixed penalty per rule, so a weak team's data
engineer (an error and three missing files: 5 - 3 - 9) is clamped to 0 on every action and has nothing to learn
from. :class:`DSBenchCoach` builds each score from the progress the action made instead; its rules are in the class
docstring, and each evaluation's ``reasoning`` lists the points of every part. It reads only the coach input: the
action's code, its run's status and error, the workspace files with their authors and sizes, the env's check of each
hand-over file (:class:`~mappa_envs.coach.protocol.FileCheck`: run in the sandbox, never on the host; never what the
agent printed), the hand-over contract, and, unless ``use_outcome=False``, the host's scoring of the submission at
the final agent's last action (its failure ``stage``, its validity and quality).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..core.text import prose
from ..core.tools import get_tool
from .dsbench_code import STALLED, failure
from .protocol import NEUTRAL_SCORE, CoachEvaluation, CoachInput, FileCheck, clamp
from .rule_based import RuleBasedCoach

_STAGE_POINTS = {  # the scorer's failure stage (mappa_envs.tasks.dsbench.scoring.Stage): points of 5, meaning
    "missing": (0.0, "no submission"),
    "unreadable": (0.5, "a file that cannot be read"),
    "empty": (0.5, "an empty file"),
    "encoding": (0.5, "a file that is not text"),
    "parse": (0.5, "a file that is not a CSV table"),
    "duplicate_columns": (1.0, "a table with repeated column names"),
    "columns": (1.0, "a table with the wrong columns"),
    "rows": (1.5, "the right columns, the wrong number of rows"),
    "ids": (1.5, "the right columns, ids that are not the test ids"),
    "values": (2.0, "the right rows, predictions that cannot be scored"),
    "metric": (2.0, "the right rows, predictions that cannot be scored"),
}
VALID, VALID_SPAN = 2.5, 2.5
"""A valid submission's deliverable: ``VALID + VALID_SPAN x quality`` (quality 0: no better than the trivial
baseline); the top of the band is reserved for submissions that beat the baseline."""
RAW_TRAIN = "train.csv"


class _Card:
    """Points by part, each with the note that explains it, and the fallback taken (None: none)."""

    def __init__(self) -> None:
        self.points: dict[str, float] = {}
        self.notes: list[str] = []
        self.fallback: str | None = None

    def add(self, part: str, points: float, why: str) -> None:
        self.points[part] = self.points.get(part, 0.0) + points
        self.notes.append(f"{part} {points:+.2g}: {why}")

    @property
    def total(self) -> float:
        return sum(self.points.values())


@dataclass
class DSBenchCoach:
    """Each action's score is the sum of three parts (0 to 10), from the progress it made.

    - **Code (0-4)**: 1 + 3 x the mean progress of its blocks: a block that ran 1; one that failed 0.2 (on its first
      working statement: imports and constants do not count) to 0.8 (its last), 0 when it does not parse (the
      failing statement and the exception are named); a timeout or out-of-memory 0.2; a block that failed on a
      hand-over file an earlier role owed and did not deliver usable 1 (the blame is upstream). A block the sandbox
      lost is left out. No code: 0 for an empty reply, 0.5 in a first turn; a later turn that concludes gets 4 when
      its files are delivered (or it owes none and broke nothing), 1 otherwise.
    - **Deliverable (0-5)**, from the env's check of the files (:class:`FileCheck`), never from printouts: 4 x the
      share of its contract files that are present, usable and its own, when this action wrote or changed one of
      them, plus 1 when all are there and the check found no problem (missing values, a model that cannot predict
      the test rows...). A later turn that changes none of its delivered files: their credit - 1 when it runs code
      (a turn that did nothing new), their full credit when it concludes. At the final agent's last action with the
      host's scoring (``use_outcome``), a submission it wrote is graded by the scorer's failure stage instead: no
      file 0, unreadable or not a table 0.5, wrong columns 1, wrong rows or ids 1.5, predictions that cannot be
      scored 2, valid 2.5 + 2.5 x its quality; a byte-for-byte copy of ``sample_submission.csv`` 0.5. A role that
      owes no file (the data engineer of ladder level 0) keeps the given files intact: 2, 4 when a block that ran
      loaded them; one that changed or removed a given file -2.
    - **Report (0-1)**: a block that ran and printed something +1 (not in a turn that did nothing new).

    **Blocked**: a role whose inputs (an earlier role's contract files, or a given file) are missing or unusable,
    and that could not deliver, gets a neutral 5 (+1 when it names the actual missing file), unless it attempts a
    workaround (writes one of its files, or reads ``train.csv`` itself): then the rules above.

    Inputs that are not DSBench's (no hand-over contract, a role without tools) are scored by the general rule
    coach, without the ground truth and the outcome when blind, and flagged as a fallback; an input this coach
    cannot read is a recorded fallback (neutral 5), not a crash; an outcome without its ``valid`` or ``stage`` key is
    graded as best it can be and flagged.
    """

    use_outcome: bool = True
    """Read the host's scoring of the submission at the final action (``dsbench-rule``); False: judge the
    submission by the env's check of its file alone (``dsbench-rule-blind``)."""
    name: str = "dsbench-rule"

    def __post_init__(self) -> None:
        if not self.use_outcome and self.name == "dsbench-rule":
            self.name = "dsbench-rule-blind"
        # what it sees (mappa_envs.coach.information): the submission's scoring against the test answers at the final
        # action, or nothing of the answers or the outcome
        self.information = ("final-answer-key",) if self.use_outcome else ("none",)
        self._general = RuleBasedCoach()

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        start = time.perf_counter()
        if not inp.artifacts or not inp.tools:
            if not self.use_outcome:  # blind: the general coach would read the answer
                inp = replace(inp, ground_truth=None, outcome=None)
            ev = self._general.evaluate(inp)
            why = "not a DSBench action (no contract or tools): scored by the general rule coach"
            return replace(
                ev, backend=self.name, reasoning=f"{why}: {ev.reasoning}", fallback_used=True, fallback_reason=why
            )
        try:
            card = score_action(inp, self.use_outcome)
        except Exception as e:  # an input it cannot read: say so on the action, never crash the rollout
            return CoachEvaluation(
                score=NEUTRAL_SCORE,
                reasoning=f"could not score the action: {type(e).__name__}: {e}",
                backend=self.name,
                latency_s=time.perf_counter() - start,
                parse="fallback",
                fallback_used=True,
                fallback_reason=f"{type(e).__name__}: {str(e)[:200]}",
            )
        return CoachEvaluation(
            score=round(clamp(card.total), 2),
            reasoning="; ".join(card.notes),
            backend=self.name,
            latency_s=time.perf_counter() - start,
            parse="rule",
            fallback_used=card.fallback is not None,
            fallback_reason=card.fallback,
        )


@dataclass(frozen=True)
class _State:
    """The workspace as one action leaves it, read from the coach input."""

    contract: dict[str, tuple[str, ...]]
    checks: dict[str, FileCheck]
    authors: dict[str, str | None]
    owed: tuple[str, ...]
    mine: list[str]
    """Its contract files, present, usable and written by it."""
    blocked: list[str]
    """Its inputs (earlier roles' files, given files broken by another) that are missing or unusable."""
    broke: list[str]
    """Given files it changed or removed."""

    def usable(self, path: str) -> bool:
        check = self.checks.get(path)
        return path in self.authors and (check is None or check.ok)


def read_state(inp: CoachInput) -> _State:
    contract = {role: tuple(files) for role, files in inp.artifacts}
    checks = {c.path: c for c in inp.file_checks}
    authors = {f.path: f.written_by for f in inp.files if f.size > 0}
    state = _State(contract, checks, authors, contract.get(inp.role, ()), [], [], [])
    state.mine.extend(p for p in state.owed if state.usable(p) and authors.get(p) == inp.agent)
    state.blocked.extend(p for r in inp.earlier_roles for p in contract.get(r, ()) if not state.usable(p))
    for p in inp.given:
        if not state.usable(p):
            by_me = p in checks and checks[p].agent == inp.agent
            (state.broke if by_me else state.blocked).append(p)
    return state


def score_action(inp: CoachInput, use_outcome: bool = True) -> _Card:
    """The three parts of :class:`DSBenchCoach`'s score for one action."""
    st = read_state(inp)
    card = _Card()
    if st.blocked and len(st.mine) < len(st.owed) and not _workaround(inp, st):
        card.add("blocked", NEUTRAL_SCORE, f"blocked by the missing or unusable upstream {', '.join(st.blocked)}")
        said = prose(inp.output)
        named = [p for p in st.blocked if p in said]
        if named:
            card.add("report", 1, f"names the missing {', '.join(named)}")
        return card
    touched = bool(set(inp.changed) & set(st.owed))
    idle = inp.turn > 1 and not touched and bool(inp.tool_status) and _delivered(st)  # nothing new after delivery
    ran = _code_part(inp, st, card)
    outcome = inp.outcome if use_outcome else None
    if outcome is not None and "valid" not in outcome:
        card.fallback = "an outcome without 'valid': the submission judged by its file check"
        outcome = None
    submission = next(iter(st.owed), None) if st.owed == ("submission.csv",) else None
    if outcome is not None and submission and st.authors.get(submission, inp.agent) == inp.agent:
        _graded_part(inp, outcome, st, card)
    elif not st.owed:
        _owes_nothing_part(inp, st, ran, idle, card)
    else:
        _contract_part(inp, st, touched, idle, card)
    if ran and not idle and any(s.strip() for s in inp.tool_stdout):
        card.add("report", 1, "its code printed what it did")
    return card


def _delivered(st: _State) -> bool:
    """Its files are all delivered (or it owes none and broke nothing)."""
    return len(st.mine) == len(st.owed) and not st.broke


def _workaround(inp: CoachInput, st: _State) -> bool:
    """A blocked role that writes one of its files or reads the raw training data itself (to rebuild its inputs)."""
    return bool(set(inp.changed) & set(st.owed)) or any(RAW_TRAIN in code for code in _calls(inp))


def _listed(missing: list[str]) -> str:
    return f" (missing {', '.join(missing)})" if missing else ""


def _code_part(inp: CoachInput, st: _State, card: _Card) -> bool:
    """The code part; returns whether every block that ran ran without error."""
    if not inp.output.strip():
        card.add("code", 0, "empty reply")
        return False
    if not inp.tool_status:
        if inp.turn <= 1:
            card.add("code", 0.5, "no code to run in its first turn")
        elif _delivered(st):
            card.add("code", 4, "concludes after delivering its files" if st.owed else "concludes")
        else:
            card.add("code", 1, "stops without delivering" + _listed([p for p in st.owed if p not in st.mine]))
        return False
    blocks = _calls(inp)
    progress, notes = [], []
    for i, status in enumerate(inp.tool_status):
        stderr = inp.tool_stderr[i] if i < len(inp.tool_stderr) else ""
        if status == "worker_lost":
            notes.append(f"block {i + 1} lost by the sandbox (left out)")
        elif status == "ok":
            progress.append(1.0)
        elif status in ("timeout", "oom"):
            progress.append(STALLED)
            notes.append(f"block {i + 1} hit the {status} limit")
        else:
            f = failure(blocks[i] if i < len(blocks) else "", stderr)
            upstream = any(p in f.message or p in f.statement for p in st.blocked)
            progress.append(1.0 if upstream else f.progress)  # it went as far as its inputs allowed
            notes.append(f"block {i + 1}: {f.describe()}" + (", an upstream file: blocked" if upstream else ""))
    if not progress:
        card.add("code", 2, "; ".join(notes))
        return False
    mean = sum(progress) / len(progress)
    ok = sum(s == "ok" for s in inp.tool_status)
    card.add("code", 1 + 3 * mean, "; ".join([f"{ok}/{len(progress)} blocks ran", *notes]))
    return ok == len(progress)


def _calls(inp: CoachInput) -> list[str]:
    """The code of the action's tool calls, in order, as its tools read them from the reply ([] if unknown)."""
    try:
        return [c for name in inp.tools for c in get_tool(name).calls(inp.output)]
    except KeyError:  # a tool this process does not know: the failing lines stay unknown
        return []


def _problems(st: _State, paths: list[str] | tuple[str, ...]) -> list[str]:
    return [f"{p}: {q}" for p in paths if p in st.checks for q in st.checks[p].problems]


def _contract_part(inp: CoachInput, st: _State, touched: bool, idle: bool, card: _Card) -> None:
    """The deliverable of a role that owes files, from the env's check of them."""
    missing = [p for p in st.owed if p not in st.mine]
    if st.blocked and missing:
        card.add("deliverable", 2, f"could not deliver: blocked by the upstream {', '.join(st.blocked)}")
        return
    if not touched and not (inp.turn > 1 and _delivered(st)):
        card.add("deliverable", 0, "wrote none of its files in this action" + _listed(missing))
        return
    share = len(st.mine) / len(st.owed)
    mine = f"{len(st.mine)}/{len(st.owed)} of its files usable" + _listed(missing)
    bad = [f"{p}: {'; '.join(st.checks[p].problems[:2])}" for p in missing if p in st.checks and p in st.authors]
    card.add("deliverable", 4 * share, mine + (f" (not usable: {' | '.join(bad)})" if bad else ""))
    if not missing:
        unchecked = [p for p in st.owed if p not in st.checks]
        problems = _problems(st, st.owed)
        if unchecked:
            card.add("deliverable", 0, f"no check recorded of {', '.join(unchecked)}")
        elif problems:
            card.add("deliverable", 0, "the check found " + " | ".join(problems[:4]))
        else:
            card.add("deliverable", 1, "the check found them well-formed")
    if idle:
        card.add("deliverable", -1, "a turn after delivering that changed none of its files")


def _owes_nothing_part(inp: CoachInput, st: _State, ran: bool, idle: bool, card: _Card) -> None:
    """A role that owes no file: it keeps the given files intact, and is credited for loading them."""
    if st.broke:
        card.add("deliverable", -2, f"changed or removed the given {', '.join(st.broke)} (keep them intact)")
        return
    loaded = ran and any(g in code for code in _calls(inp) for g in inp.given)
    if loaded or (not inp.tool_status and inp.turn > 1):
        card.add("deliverable", 4, "loaded the given files and kept them intact" if loaded else "owes no file")
    else:
        card.add("deliverable", 2, "owes no file" + ("; its code did not load the given files" if inp.given else ""))
    if idle:
        card.add("deliverable", -1, "a later turn with nothing left to do")


def _graded_part(inp: CoachInput, outcome: dict, st: _State, card: _Card) -> None:
    """The final action's own submission, graded by the host's scoring (how close an invalid one came)."""
    check = st.checks.get("submission.csv")
    copied = check is not None and any("copy of sample_submission.csv" in p for p in check.problems)
    if copied:
        card.add("deliverable", 0.5, "a byte-for-byte copy of sample_submission.csv")
        return
    reason = str(outcome.get("reason", ""))[:160]
    if outcome["valid"]:
        quality = min(1.0, max(0.0, float(outcome.get("quality") or 0.0)))
        band = "beats the trivial baseline" if quality > 0 else "no better than the trivial baseline"
        card.add("deliverable", VALID + VALID_SPAN * quality, f"a valid submission, quality {quality:.3f} ({band})")
        return
    stage = outcome.get("stage")
    if stage not in _STAGE_POINTS:
        card.fallback = f"an invalid outcome without a known failure stage ({stage!r}): graded as unscorable"
        card.add("deliverable", 0.5, f"an invalid submission: {reason}")
        return
    points, meaning = _STAGE_POINTS[stage]
    card.add("deliverable", points, f"{meaning}: {reason}")


__all__ = ["VALID", "VALID_SPAN", "DSBenchCoach", "read_state", "score_action"]
