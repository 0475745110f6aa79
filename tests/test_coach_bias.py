"""Bias diagnostics flag a systematic gap between task types, and normalisation removes it."""

import random

from benchmarks.cli import main
from mappa_envs.coach.bias import bias_report, normalize_scores
from mappa_envs.core import ActionRecord, EpisodeRecord, write_jsonl


def synthetic(n=60, gap=1.5, seed=0):
    rng = random.Random(seed)
    records = []
    for i in range(n):
        task_type = "regression" if i % 2 else "classification"
        rec = EpisodeRecord("x/Y-v0", f"e{i}", f"t{i}", "task", None, outcome={"success": rng.random() < 0.5})
        rec.metadata["task_type"] = task_type
        for j, role in enumerate(("data_engineer", "modeler", "analyst")):
            score = min(10, max(0, rng.gauss(5 + (gap if task_type == "regression" else 0), 1.0)))
            rec.actions.append(ActionRecord(j, f"{role}_0", role, 1, [], "out", info={"coach": {"score": score}}))
        records.append(rec)
    return records


def test_gap_between_task_types_is_flagged():
    groups, gaps = bias_report(synthetic(gap=1.5))
    flagged = [(g.dimension, g.high, g.low) for g in gaps]
    assert ("task_type", "regression", "classification") in flagged
    reg = next(g for g in groups if g.group == "regression")
    lo, hi = reg.ci95
    assert lo < reg.mean < hi


def test_no_gap_no_flag():
    _, gaps = bias_report(synthetic(gap=0.0))
    assert not [g for g in gaps if g.dimension == "task_type"]


def test_normalisation_removes_the_gap():
    records = synthetic(gap=1.5)
    assert normalize_scores(records) == 180
    _, gaps = bias_report(records, score_key="normalized_score")
    assert not [g for g in gaps if g.dimension == "task_type"]
    assert all(0 <= a.reward <= 1 for r in records for a in r.actions)


def test_cli_report(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, synthetic(gap=1.5))
    assert main(["report", "coach-bias", str(path), "--normalize"]) == 0
    out = capsys.readouterr().out
    assert "FLAGGED" in out and "'regression' scored" in out and "after per-group normalisation" in out
