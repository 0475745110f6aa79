"""DSBench's progress coaches (issue 33) on constructed actions: scores that vary with, and rise with, the progress
an action made; the submission graded by how close it came; blame moved in hindsight; fallbacks recorded; what each
coach reads declared."""

from dataclasses import replace
from itertools import pairwise

import pandas as pd
import pytest

from mappa_envs.coach import RuleBasedCoach, coach_from_spec
from mappa_envs.coach.dsbench_code import failure
from mappa_envs.coach.dsbench_hindsight import DSBenchHindsightCoach
from mappa_envs.coach.dsbench_rules import DSBenchCoach
from mappa_envs.coach.information import information_label
from mappa_envs.coach.protocol import CoachInput, FileCheck, FileInfo
from mappa_envs.core import EpisodeRecord
from mappa_envs.tasks.dsbench import load_lite, score_bytes
from mappa_envs.tasks.dsbench.prompts import ARTIFACTS

TASK = "# Penguins\n\ntrain.csv has 258 rows, test.csv 86. Each row has an `id`.\n- species (target)"
DATA = (FileInfo("train.csv", 13470, None), FileInfo("test.csv", 3956, None))
ROLES = ("data_engineer", "modeler", "analyst")


def _files(written: dict[str, str]) -> tuple[FileInfo, ...]:
    """The task's files and ``written`` (file -> role that wrote it)."""
    return (*DATA, *(FileInfo(p, 900, f"{role}_0") for p, role in written.items()))


def ok(role: str, rows: int | None = None) -> dict:
    """The env's check of a usable file written by ``role``."""
    return {"ok": True, "role": role, "rows": rows}


def bad(role: str, *problems: str, usable: bool = False) -> dict:
    """The env's check of a file with ``problems`` (unusable unless ``usable``)."""
    return {"ok": usable, "role": role, "problems": problems}


def _checks(written: dict[str, str], checks: dict[str, dict] | None) -> tuple[FileCheck, ...]:
    """The env's checks: ``checks`` as given, else every written contract file found usable."""
    if checks is None:
        contract = {p for files in ARTIFACTS.values() for p in files}
        checks = {p: ok(role) for p, role in written.items() if p in contract}
    return tuple(
        FileCheck(
            p,
            c.get("present", True),
            c["ok"],
            tuple(c.get("problems", ())),
            c.get("rows"),
            f"{c['role']}_0",
            c.get("given", False),
        )
        for p, c in checks.items()
    )


def action(role: str, code: str | None = None, *, status: str = "ok", stdout: str = "", stderr: str = "", **kw):
    """One DSBench action: ``code`` (None: a reply without code) with its run's status and streams; ``written``:
    the files present (file -> author role), ``changed``: those this action wrote (default: its role's),
    ``checks``: the env's checks (default: every written contract file usable)."""
    output = kw.pop("output", None) or (f"Here is my code.\n\n```python\n{code}\n```" if code is not None else "Done.")
    run = code is not None
    written = kw.pop("written", {})
    changed = kw.pop("changed", None)
    if changed is None:
        changed = [p for p, r in written.items() if r == role] if run else []
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
        files=_files(written),
        earlier_roles=ROLES[: ROLES.index(role)] if role in ROLES else (),
        artifacts=tuple(kw.pop("artifacts", ARTIFACTS).items()),
        tools=("python",),
        file_checks=_checks(written, kw.pop("checks", None)),
        changed=tuple(changed),
        **kw,
    )


CODE = "import pandas as pd\ntrain = pd.read_csv('train.csv')\nfeatures = train.drop(columns=['species'])\nprint(1)"


def _error(line: int, kind: str = "KeyError: 'rentals'") -> str:
    return f'Traceback (most recent call last):\n  File "/tmp/s/code/cell_1.py", line {line}, in <module>\n{kind}\n'


ALL_THREE = {"X_train.pkl": "data_engineer", "y_train.pkl": "data_engineer", "X_test.pkl": "data_engineer"}


WITH_NAN = {
    "X_train.pkl": bad("data_engineer", "3 missing values", usable=True),
    "y_train.pkl": ok("data_engineer"),
    "X_test.pkl": ok("data_engineer"),
}


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
        (
            "writes all three, with missing values",
            action("data_engineer", CODE, stdout="ok", written=ALL_THREE, checks={**WITH_NAN}),
        ),
        ("the check finds them well-formed", action("data_engineer", CODE, stdout="ok", written=ALL_THREE)),
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


UPSTREAM = {**ALL_THREE, "model.pkl": "modeler"}


def test_an_input_it_cannot_read_is_a_recorded_fallback_not_a_crash():
    bad = [
        action("analyst", "print(1)", written=UPSTREAM, outcome={"valid": True, "quality": "n/a"}, is_final=True),
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


def test_a_task_without_a_contract_is_scored_by_the_general_rules_flagged_and_blind_without_the_answer():
    """The delegation is a counted fallback, and the blind coach hands the general coach neither the ground truth
    nor the outcome (it scored 8 with the ground truth "42" and 1 with "41")."""
    inp = action("solver", output="6 * 7 = \\boxed{42}", artifacts={})
    ev = DSBenchCoach().evaluate(inp)
    assert ev.backend == "dsbench-rule" and ev.fallback_used and "general rule coach" in ev.fallback_reason
    assert ev.score == RuleBasedCoach().evaluate(inp).score
    blind = DSBenchCoach(use_outcome=False)
    with_key = [blind.evaluate(replace(inp, ground_truth=gt, is_final=True, answers=True)) for gt in ("42", "41")]
    assert with_key[0].score == with_key[1].score and all(e.fallback_used for e in with_key)


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


@pytest.mark.parametrize("x_test_rows, printed, culprit", [(80, "(258, 7) (86, 7)", 0), (86, "(258, 7) (80, 7)", 2)])
def test_hindsight_blames_lost_test_rows_by_the_check_not_the_printout(x_test_rows, printed, culprit):
    """Whose fault the submission's 80 rows are is read from the env's check of X_test.pkl, whatever the data
    engineer printed."""
    written = {**ALL_THREE, "model.pkl": "modeler", "submission.csv": "analyst"}
    rows_ok = x_test_rows == 86
    checks = {p: ok(r) for p, r in written.items()}
    checks["X_test.pkl"] = ok("data_engineer", 86) if rows_ok else bad("data_engineer", "80 rows, not test.csv's 86")
    reason = "80 rows, expected 86 (one per row of test.csv)"
    outcome = {"valid": False, "reason": reason, "quality": 0.0, "stage": "rows"}
    inputs = [
        action("data_engineer", CODE, stdout=printed, written=written, checks=checks),
        action("modeler", CODE, stdout="0.9", written=written, checks=checks),
        action("analyst", CODE, stdout="(80, 2)", written=written, outcome=outcome, is_final=True, checks=checks),
    ]
    before = [DSBenchCoach().evaluate(i).score for i in inputs]
    after = [ev.score for ev in DSBenchHindsightCoach().evaluate_episode(inputs, _episode(outcome))]
    assert after[culprit] < before[culprit], (before, after)
    assert after[2 - culprit] >= before[2 - culprit]


def test_hindsight_rewards_the_roles_that_delivered_a_valid_episode_by_its_quality():
    written = {**ALL_THREE, "model.pkl": "modeler", "submission.csv": "analyst"}
    soft = {p: bad(r, "1 empty cell", usable=True) for p, r in written.items()}  # 8 each, before hindsight
    inputs = [action(r, turn=2, written=written, checks=soft) for r in ROLES]  # each concludes after delivering
    scores = {}
    for quality in (0.1, 0.9):
        outcome = {"success": True, "valid": True, "quality": quality, "beats_baseline": True}
        evs = DSBenchHindsightCoach().evaluate_episode(inputs, _episode(outcome))
        scores[quality] = [ev.score for ev in evs]
    before = [DSBenchCoach().evaluate(i).score for i in inputs]
    assert all(b < lo < hi for b, lo, hi in zip(before, scores[0.1], scores[0.9], strict=True)), (before, scores)


def test_hindsight_gives_no_success_bonus_to_failed_code_or_a_role_that_did_not_deliver():
    """A valid episode used to add +1 to every action, a failing block included."""
    written = {**ALL_THREE, "model.pkl": "modeler", "submission.csv": "analyst"}
    failed = action("data_engineer", CODE, status="error", stderr=_error(3), written=written, changed=[])
    inputs = [failed, action("data_engineer", CODE, stdout="ok", turn=2, written=written)]
    inputs += [action(r, CODE, stdout="ok", written=written) for r in ROLES[1:]]
    outcome = {"success": True, "valid": True, "quality": 0.5, "beats_baseline": True}
    evs = DSBenchHindsightCoach().evaluate_episode(inputs, _episode(outcome))
    assert evs[0].score == DSBenchCoach().evaluate(failed).score  # not its last action: no bonus
    at_baseline = {**outcome, "quality": 0.0, "beats_baseline": False}
    base = DSBenchHindsightCoach().evaluate_episode(inputs, _episode(at_baseline))
    assert [e.score for e in base] == [DSBenchCoach().evaluate(i).score for i in inputs]  # nothing to add
    junk = {p: ok(r) for p, r in written.items()} | {"model.pkl": bad("modeler", "does not load")}
    inputs[2] = action("modeler", CODE, stdout="0.9", written=written, checks=junk)
    inputs[3] = replace(inputs[3], file_checks=_checks(written, junk))
    evs = DSBenchHindsightCoach().evaluate_episode(inputs, _episode(outcome))
    assert "delivered" not in evs[2].reasoning.partition("hindsight")[2]


def test_junk_hand_over_files_and_printed_shapes_earn_nothing_and_the_blame_stays_upstream():
    """Files judged by the env's check, never by what was printed: 'x' written into the pickles with the right shapes
    printed was 10/10, and the modeler's UnpicklingError on them was charged to the modeler."""
    junk = {p: bad("data_engineer", "does not load: UnpicklingError: invalid load key, 'x'.") for p in ALL_THREE}
    shapes = "(258, 7) (258,) (86, 7)"
    cheat = action("data_engineer", CODE, stdout=shapes, written=ALL_THREE, checks=junk)
    nothing = action("data_engineer", CODE, stdout=shapes)
    assert DSBenchCoach().evaluate(cheat).score <= DSBenchCoach().evaluate(nothing).score <= 5
    stderr = _error(2, "_pickle.UnpicklingError: invalid load key, 'x'.")
    code = "import pandas as pd\nX = pd.read_pickle('X_train.pkl')\nprint(1)"
    modeler = action("modeler", code, status="error", stderr=stderr, written=ALL_THREE, checks=junk)
    ev = DSBenchCoach().evaluate(modeler)
    assert ev.score == 5.0 and "blocked" in ev.reasoning  # neutral: not its failure
    model = action("modeler", "print(0.5)", stdout="0.5", written=UPSTREAM, checks={"model.pkl": bad("modeler", "x")})
    assert DSBenchCoach().evaluate(model).score <= 5
    sub = {**UPSTREAM, "submission.csv": "analyst"}
    wrong = {"submission.csv": bad("analyst", "columns ['x'], not ['id', 'species']", "0 rows, not test.csv's 86")}
    analyst = action("analyst", "print((86, 2))", stdout="(86, 2)", written=sub, checks=wrong)
    assert DSBenchCoach(use_outcome=False).evaluate(analyst).score <= 5


def test_stopping_after_delivering_scores_at_least_as_much_as_more_code():
    """A later turn that changes none of its delivered files: print(1) scored 9, concluding without code 7."""
    more = action("data_engineer", "print(1)", stdout="1", turn=2, written=ALL_THREE, changed=[])
    stop = action("data_engineer", turn=2, written=ALL_THREE)
    assert DSBenchCoach().evaluate(stop).score > DSBenchCoach().evaluate(more).score
    redo = action("data_engineer", CODE, stdout="ok", turn=2, written=ALL_THREE)  # rewrote its files: new work
    assert DSBenchCoach().evaluate(redo).score > DSBenchCoach().evaluate(more).score


GIVEN = ("X_train.pkl", "y_train.pkl", "X_test.pkl")
LEVEL0 = {**ARTIFACTS, "data_engineer": ()}


def test_level_0_data_engineer_is_credited_for_loading_the_given_files_and_charged_for_breaking_them():
    """At level 0 any block that ran scored 2 + 2 ("checked the given ones"), os.remove('X_test.pkl') 9, and the
    modeler that then failed on X_test.pkl was charged."""
    kw = {"artifacts": LEVEL0, "given": GIVEN}
    load = "import pandas as pd\nX = pd.read_pickle('X_train.pkl')\nprint(X.shape)"
    loads = action("data_engineer", load, stdout="(258, 7)", **kw)
    prints = action("data_engineer", "print(1)", stdout="1", **kw)
    gone = {"X_test.pkl": {"ok": False, "present": False, "role": "data_engineer", "given": True, "problems": ["x"]}}
    removes = action("data_engineer", "import os\nos.remove('X_test.pkl')", checks=gone, **kw)
    scores = [DSBenchCoach().evaluate(i).score for i in (removes, prints, loads)]
    assert scores[0] < scores[1] < scores[2] and scores[0] <= 3, scores
    stderr = _error(3, "FileNotFoundError: [Errno 2] No such file or directory: 'X_test.pkl'")
    code = "import pandas as pd\nX = pd.read_pickle('X_train.pkl')\nt = pd.read_pickle('X_test.pkl')"
    modeler = action("modeler", code, status="error", stderr=stderr, checks=gone, **kw)
    assert DSBenchCoach().evaluate(modeler).score == 5.0  # blocked by the data engineer, not charged


def test_a_copied_sample_and_a_baseline_submission_are_far_below_one_that_beats_the_baseline(penguins):
    """Copying sample_submission.csv scored 9 (valid, quality 0.000)."""
    written = {**UPSTREAM, "submission.csv": "analyst"}
    copy = "import shutil\nshutil.copy('sample_submission.csv', 'submission.csv')"
    sample = score_bytes(penguins, penguins.sample_file.read_bytes()).outcome()
    assert sample["valid"] and sample["quality"] == 0
    copied = {"submission.csv": bad("analyst", "a byte-for-byte copy of sample_submission.csv")}
    scores = [
        DSBenchCoach().evaluate(action("analyst", copy, written=written, checks=c, outcome=o, is_final=True)).score
        for c, o in ((copied, sample), (None, sample), (None, {**sample, "quality": 0.9, "beats_baseline": True}))
    ]
    assert scores[0] <= 5 < scores[1] < scores[2] - 2, scores


def test_padding_a_block_with_imports_does_not_move_its_failure_and_a_timeout_is_no_better_than_an_error():
    """30 `import os` lines before a failing statement raised 1.6 to 3.4; a timeout (2.5) beat an early error."""
    code = "import pandas as pd\ny = pd.read_csv('train.csv')['rentals']\nprint(y)"
    padded = "import os\n" * 30 + "\n\n" + code
    plain = action("data_engineer", code, status="error", stderr=_error(2))
    pad = action("data_engineer", padded, status="error", stderr=_error(33))
    timeout = action("data_engineer", code, status="timeout")
    s_plain, s_pad, s_timeout = (DSBenchCoach().evaluate(i).score for i in (plain, pad, timeout))
    assert s_pad == s_plain and s_timeout <= s_plain


def test_a_library_file_named_like_a_cell_is_not_the_blocks_frame():
    stderr = (
        'File "/tmp/s/code/cell_1.py", line 2, in <module>\n'
        'File "/usr/lib/python3/site-packages/foo/mycell.py", line 40, in f\nValueError: bad'
    )
    assert failure("import foo\nfoo.f()\n", stderr).line == 2


def test_submissions_are_graded_by_the_scorers_stage_not_its_wording():
    """A metric error whose message mentions "columns" was graded as wrong columns; an outcome without "valid"
    silently fell back to the blind path."""
    written = {**UPSTREAM, "submission.csv": "analyst"}

    def score(outcome):
        return DSBenchCoach().evaluate(action("analyst", "print(1)", written=written, outcome=outcome, is_final=True))

    metric = score({"valid": False, "stage": "metric", "reason": "the metric could not be computed: 3 columns"})
    columns = score({"valid": False, "stage": "columns", "reason": "wrong columns"})
    duplicate = score({"valid": False, "stage": "duplicate_columns", "reason": "duplicate column names"})
    assert metric.score > columns.score == duplicate.score and not metric.fallback_used
    for outcome in ({"stage": "rows", "reason": "x"}, {"valid": False, "reason": "80 rows, expected 86"}):
        assert score(outcome).fallback_used  # a missing key is a counted fallback


def test_a_blocked_role_is_neutral_unless_it_works_around_and_only_the_missing_names_count():
    """A blocked modeler running print('hi') scored 7, and any reply saying "missing" earned the report point."""
    two = {"X_train.pkl": "data_engineer", "y_train.pkl": "data_engineer"}
    hi = action("analyst", "print('hi')", stdout="hi", written={**two, "model.pkl": "modeler"})
    vague = action(
        "analyst",
        "print('hi')",
        stdout="hi",
        written={**two, "model.pkl": "modeler"},
        output="```python\nprint('hi')\n```\nSomething is missing.",
    )
    named = replace(vague, output="```python\nprint('hi')\n```\nX_test.pkl was never written.")
    assert DSBenchCoach().evaluate(hi).score == DSBenchCoach().evaluate(vague).score == 5.0
    assert DSBenchCoach().evaluate(named).score == 6.0


def test_the_analyst_is_not_graded_on_a_submission_the_modeler_wrote():
    written = {**UPSTREAM, "submission.csv": "modeler"}
    outcome = {"valid": True, "quality": 0.9, "beats_baseline": True, "stage": None}
    inp = action("analyst", "print(1)", stdout="1", written=written, outcome=outcome, is_final=True, changed=[])
    ev = DSBenchCoach().evaluate(inp)
    assert "a valid submission" not in ev.reasoning and ev.score <= 5
