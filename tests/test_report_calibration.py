"""Coach calibration in `mappa report run`: the reliability diagram renders in the HTML report, the AUROC agrees
with scikit-learn's on fixed scores, and a gap between task types is reported with its p-value."""

import importlib.util
import json
import random

import pytest

from mappa_envs.coach.calibration import auroc, calibration, calibration_gaps
from mappa_envs.core import ActionRecord, EpisodeRecord, write_jsonl


def _records(n: int, seed: int, informed: str = "regression") -> list[EpisodeRecord]:
    """Two task types: on the ``informed`` one the solver's score follows success; on the other it is noise (the
    checker's score is always 5)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = "regression" if i % 2 else "classification"
        ok = rng.random() < 0.5
        score = (7.0 + 3 * rng.random() if ok else 3 * rng.random()) if kind == informed else 10 * rng.random()
        rec = EpisodeRecord("e", f"ep{i}", f"t{i}", "p", i, outcome={"success": ok}, metadata={"task_type": kind})
        rec.actions = [
            ActionRecord(0, "solver_0", "solver", 1, [], "x", info={"coach": {"score": round(score, 1)}}),
            ActionRecord(1, "checker_0", "checker", 1, [], "y", info={"coach": {"score": 5.0}}),
        ]
        out.append(rec)
    return out


def test_auroc_agrees_with_scikit_learn_on_fixed_scores():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(3)
    for _ in range(20):
        labels = [rng.random() < 0.4 for _ in range(30)]
        if len(set(labels)) < 2:
            continue
        scores = [float(rng.randint(0, 10)) for _ in labels]  # integer scores: many ties, as coaches give
        assert auroc(scores, labels) == pytest.approx(metrics.roc_auc_score(labels, scores))


def test_a_calibration_gap_between_task_types_is_reported_as_significant():
    table = calibration(_records(200, seed=0))
    # the checker's constant scores are in both task types' groups: 0.5 from them, ~1 or ~0.5 from the solver's
    assert table["task_type"]["regression"].auroc > 0.8
    assert 0.4 < table["task_type"]["classification"].auroc < 0.6
    (gap,) = [g for g in calibration_gaps(table) if g.dimension == "task_type"]
    assert (gap.a, gap.b) == ("classification", "regression") and gap.diff < -0.25 and gap.significant
    # the same coach when neither task type informs its scores: no significant gap
    neither = calibration(_records(200, seed=0, informed="none"))
    (gap,) = [g for g in calibration_gaps(neither) if g.dimension == "task_type"]
    assert abs(gap.diff) < 0.15 and not gap.significant


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs the 'report' extra")
def test_report_run_renders_the_reliability_diagram_and_tables(tmp_path):
    from benchmarks.cli import main

    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    records = _records(80, seed=2)
    for it in (1, 2):
        write_jsonl(run / "rollouts" / f"iter-{it:05d}.jsonl", records[(it - 1) * 40 : it * 40])
    lines = [{"iteration": it, "accuracy": 0.5, "solver": {"mean_coach_score": 5.0}} for it in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = tmp_path / "report"
    assert main(["report", "run", str(run), "--out", str(out)]) == 0
    data = (out / "calibration.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    md = (out / "report.md").read_text()
    assert "## Coach calibration (tables)" in md and "![Coach calibration" in md
    solver = calibration(records)["role"]["solver"]
    assert f"| role solver | 80 | {sum(solver.success)} | {solver.auroc:.2f} [" in md
    assert "| role checker | 80 |" in md and "not above chance" in md
    assert "| task_type: classification - regression |" in md and "(significant)" in md
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "calibration" in page
