"""DSBench's progress coaches (issue 33) on constructed actions: scores that vary with, and rise with, the progress
an action made; the submission graded by how close it came; blame moved in hindsight; fallbacks recorded; what each
coach reads declared."""

from itertools import pairwise

import pandas as pd
import pytest

from mappa_envs.coach import RuleBasedCoach, coach_from_spec
from mappa_envs.coach.dsbench_hindsight import DSBenchHindsightCoach
from mappa_envs.coach.dsbench_rules import DSBenchCoach, failure
from mappa_envs.coach.information import information_label
from mappa_envs.coach.protocol import CoachInput, FileInfo
from mappa_envs.core import EpisodeRecord
from mappa_envs.tasks.dsbench import load_lite, score_bytes
from mappa_envs.tasks.dsbench.prompts import ARTIFACTS

TASK = "# Penguins\n\ntrain.csv has 258 rows, test.csv 86. Each row has an `id`.\n- species (target)"
DATA = (FileInfo("train.csv", 13470, None), FileInfo("test.csv", 3956, None))
ROLES = ("data_engineer", "modeler", "analyst")


def _files(written: dict[str, str]) -> tuple[FileInfo, ...]:
    """The task's files and ``written`` (file -> role that wrote it)."""
    return (*DATA, *(FileInfo(p, 900, f"{role}_0") for p, role in written.items()))


def action(role: str, code: str | None = None, *, status: str = "ok", stdout: str = "", stderr: str = "", **kw):
    """One DSBench action: ``code`` (None: a reply without code) with its run's status and streams."""
    output = kw.pop("output", None) or (f"Here is my code.\n\n```python\n{code}\n```" if code is not None else "Done.")
    run = code is not None
    return CoachInput(
        env_id="mappa/DSBench-v0",
        task_id="penguin-species",
        task=TASK,
        task_type="classification",
        template="dsbench",
        agent=f"{role}_0",
        role=role,
        turn=kw.pop("turn", 1),
        agent_input="",
        output=output,
        tool_feedback="",
        tool_status=(status,) if run else (),
        tool_stdout=(stdout,) if run else (),
        tool_stderr=(stderr,) if run else (),
        files=_files(kw.pop("written", {})),
        earlier_roles=ROLES[: ROLES.index(role)] if role in ROLES else (),
        artifacts=tuple(kw.pop("artifacts", ARTIFACTS).items()),
        tools=("python",),
        **kw,
    )


CODE = "import pandas as pd\ntrain = pd.read_csv('train.csv')\nfeatures = train.drop(columns=['species'])\nprint(1)"


def _error(line: int, kind: str = "KeyError: 'rentals'") -> str:
    return f'Traceback (most recent call last):\n  File "/tmp/s/code/cell_1.py", line {line}, in <module>\n{kind}\n'


ALL_THREE = {"X_train.pkl": "data_engineer", "y_train.pkl": "data_engineer", "X_test.pkl": "data_engineer"}


def data_engineer_ladder() -> list[tuple[str, CoachInput]]:
    """A data engineer's actions from no progress to a complete, checked hand-over."""
    return [
        ("empty reply", action("data_engineer", output=" ")),
        ("no code", action("data_engineer", output="I will look at the data.")),
        ("does not parse", action("data_engineer", CODE, status="error", stderr=_error(2, "SyntaxError: invalid"))),
        ("fails on line 1", action("data_engineer", CODE, status="error", stderr=_error(1))),
        ("fails on line 3", action("data_engineer", CODE, status="error", stderr=_error(3))),
        ("runs, writes nothing", action("data_engineer", CODE)),
        ("writes one file", action("data_engineer", CODE, stdout="ok", written={"X_train.pkl": "data_engineer"})),
        ("writes all three", action("data_engineer", CODE, stdout="ok", written=ALL_THREE)),
        ("and prints their shapes", action("data_engineer", CODE, stdout="(258, 7) (258,) (86, 7)", written=ALL_THREE)),
    ]


def test_scores_rise_with_the_data_engineers_progress():
    coach = DSBenchCoach()
    scores = [(name, coach.evaluate(inp).score) for name, inp in data_engineer_ladder()]
    assert all(a[1] < b[1] for a, b in pairwise(scores)), scores
    assert scores[0][1] == 0 and scores[-1][1] == 10


def test_a_weak_data_engineer_is_no_longer_zero_on_every_action():
    """The issue's case: an error and three missing files are 5 - 3 - 9 = 0 for the rule coach, whatever the code did;
    the progress coach tells the actions apart."""
    weak = [inp for name, inp in data_engineer_ladder() if name.startswith(("fails", "does not", "runs"))]
    assert {RuleBasedCoach().evaluate(inp).score for inp in weak} <= {0.0, 1.0}
    assert len({DSBenchCoach().evaluate(inp).score for inp in weak}) == len(weak)


def test_the_failing_statement_and_why_are_named():
    ev = DSBenchCoach().evaluate(action("data_engineer", CODE, status="error", stderr=_error(3)))
    assert "line 3 of 4 `features = train.drop(columns=['species'])` raised KeyError" in ev.reasoning
    assert "a column or key the data does not have" in ev.reasoning
    f = failure("x = 1", "Killed")  # no traceback: the line is unknown, the progress a middle value
    assert f.line is None and f.progress == pytest.approx(0.4)


def test_a_blocked_role_is_not_charged_and_naming_the_missing_file_earns():
    stderr = _error(1, "FileNotFoundError: [Errno 2] No such file or directory: 'X_test.pkl'")
    code = "X_test = pd.read_pickle('X_test.pkl')"
    partial = {"X_train.pkl": "data_engineer", "y_train.pkl": "data_engineer", "model.pkl": "modeler"}
    silent = action("analyst", code, status="error", stderr=stderr, written=partial)
    named = action(
        "analyst",
        code,
        status="error",
        stderr=stderr,
        written=partial,
        output=f"```python\n{code}\n```\nX_test.pkl is missing: the data engineer did not write it.",
    )
    own = action(
        "analyst",
        code,
        status="error",
        stderr=_error(1, "NameError: name 'pd' is not defined"),
        written={**ALL_THREE, "model.pkl": "modeler"},
    )
    s_silent, s_named, s_own = (DSBenchCoach().evaluate(i).score for i in (silent, named, own))
    assert s_own < s_silent < s_named
    assert "blocked" in DSBenchCoach().evaluate(silent).reasoning


@pytest.fixture(scope="module")
def penguins():
    return next(t for t in load_lite("eval").tasks if t.id == "penguin-species")


def test_submissions_are_graded_by_how_close_they_came(penguins):
    """Reasons from the host's own scorer, from no file to a valid submission: the score rises."""
    test = pd.read_csv(penguins.test_file)
    answers = pd.read_csv(penguins.answer_file)

    def outcome(frame):
        score = score_bytes(penguins, frame.to_csv(index=False).encode()) if frame is not None else None
        if score is None:
            return {"valid": False, "reason": "no submission.csv in the workspace", "quality": 0.0}
        return {**score.outcome(), "summary": score.summary()}

    steps = [
        outcome(None),
        outcome(pd.DataFrame({"a": [1]})),  # wrong columns
        outcome(answers.head(10)),  # wrong row count
        outcome(test[["id"]].assign(species="")),  # empty predictions
        outcome(test[["id"]].assign(species="Adelie")),  # valid, the baseline
        outcome(answers),  # valid, perfect
    ]
    written = {**ALL_THREE, "model.pkl": "modeler", "submission.csv": "analyst"}
    scores = [
        DSBenchCoach().evaluate(action("analyst", "print(1)", stdout="1", written=written, outcome=o, is_final=True))
        for o in steps
    ]
    values = [ev.score for ev in scores]
    assert all(a < b for a, b in pairwise(values)), [(s["reason"], v) for s, v in zip(steps, values, strict=True)]
    blind = {
        DSBenchCoach(use_outcome=False).evaluate(action("analyst", "print(1)", written=written, outcome=o)).score
        for o in steps[1:]
    }
    assert len(blind) == 1  # the blind coach never reads the scoring


def test_an_input_it_cannot_read_is_a_recorded_fallback_not_a_crash():
    bad = [
        action("analyst", "print(1)", outcome={"valid": True, "quality": "n/a"}, is_final=True),
        action("data_engineer", CODE, artifacts={"data_engineer": None}),
    ]
    for inp in bad:
        ev = DSBenchCoach().evaluate(inp)
        assert ev.fallback_used and ev.parse == "fallback" and ev.score == 5.0 and ev.fallback_reason
    record = EpisodeRecord(
        "mappa/DSBench-v0", "e", "penguin-species", TASK, 0, outcome={"success": False, "quality": 0}
    )
    good = action("data_engineer", CODE)
    evs = DSBenchHindsightCoach().evaluate_episode([good, action("modeler", CODE, artifacts={"x": None})], record)
    assert all(ev.fallback_used and "per-action score kept" in ev.fallback_reason for ev in evs)


def test_a_task_without_a_contract_is_scored_by_the_general_rules():
    inp = action("solver", output="6 * 7 = \\boxed{42}", artifacts={})
    ev = DSBenchCoach().evaluate(inp)
    assert ev.backend == "dsbench-rule" and not ev.fallback_used
    assert ev.score == RuleBasedCoach().evaluate(inp).score


@pytest.mark.parametrize(
    "spec, label, cls",
    [
        ("dsbench-rule", "final-answer-key", DSBenchCoach),
        ("dsbench-rule-blind", "none", DSBenchCoach),
        ("dsbench-rule-hindsight", "outcome+final-answer-key", DSBenchHindsightCoach),
    ],
)
def test_specs_and_information_labels(spec, label, cls):
    coach = coach_from_spec(spec)
    assert isinstance(coach, cls) and coach.name == spec and information_label(coach) == label


def _episode(outcome):
    return EpisodeRecord("mappa/DSBench-v0", "e", "penguin-species", TASK, 0, outcome=outcome)


def test_hindsight_moves_the_blame_of_a_missing_file_upstream():
    two = {"X_train.pkl": "data_engineer", "y_train.pkl": "data_engineer"}
    stderr = _error(1, "FileNotFoundError: [Errno 2] No such file or directory: 'X_test.pkl'")
    inputs = [
        action("data_engineer", CODE, stdout="(258, 7)", written=two),
        action("modeler", CODE, stdout="0.91", written={**two, "model.pkl": "modeler"}),
        action(
            "analyst",
            "pd.read_pickle('X_test.pkl')",
            status="error",
            stderr=stderr,
            written={**two, "model.pkl": "modeler"},
            is_final=True,
            outcome={"valid": False, "reason": "no submission.csv in the workspace", "quality": 0.0},
        ),
    ]
    record = _episode({"success": False, "valid": False, "reason": "no submission.csv", "quality": 0.0})
    before = [DSBenchCoach().evaluate(i).score for i in inputs]
    after = [ev.score for ev in DSBenchHindsightCoach().evaluate_episode(inputs, record)]
    assert after[0] < before[0] and after[2] > before[2], (before, after)
    assert after[1] == before[1]  # the modeler's part is neither its failure nor blocked


def test_hindsight_blames_lost_test_rows_on_the_data_engineer():
    written = {**ALL_THREE, "model.pkl": "modeler", "submission.csv": "analyst"}
    reason = "80 rows, expected 86 (one per row of test.csv)"
    outcome = {"valid": False, "reason": reason, "quality": 0.0}
    inputs = [
        action("data_engineer", CODE, stdout="(258, 7) (80, 7)", written=written),
        action("modeler", CODE, stdout="0.9", written=written),
        action("analyst", CODE, stdout="(80, 2)", written=written, outcome=outcome, is_final=True),
    ]
    before = [DSBenchCoach().evaluate(i).score for i in inputs]
    after = [ev.score for ev in DSBenchHindsightCoach().evaluate_episode(inputs, _episode(outcome))]
    assert after[0] < before[0] and after[2] > before[2]


def test_hindsight_rewards_every_action_of_a_valid_episode_by_its_quality():
    written = {**ALL_THREE, "model.pkl": "modeler", "submission.csv": "analyst"}
    inputs = [action(r, turn=2, written=written) for r in ROLES]  # each concludes after delivering
    scores = {}
    for quality in (0.1, 0.9):
        outcome = {"success": True, "valid": True, "quality": quality}
        evs = DSBenchHindsightCoach().evaluate_episode(inputs, _episode(outcome))
        scores[quality] = [ev.score for ev in evs]
        assert all("the episode made a valid submission" in ev.reasoning for ev in evs)
    before = [DSBenchCoach().evaluate(i).score for i in inputs]
    assert all(b < lo < hi for b, lo, hi in zip(before, scores[0.1], scores[0.9], strict=True)), (before, scores)
