"""The ablation report's comparison: each run's held-out change with its exact paired test, run-vs-run tests on
the same episodes, per-role behaviour before -> after (handwritten run folders, exact figures)."""

import json

from benchmarks.report import Run, comparison_tables


def _write_run(path, estimator, coach, before, after, iteration_s=(100.0, 110.0)):
    path.mkdir(parents=True)
    info = "outcome" if estimator == "outcome" else "final-answer-key"
    (path / "config.json").write_text(json.dumps({"estimator": estimator, "coach": coach, "reward_information": info}))
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({"iteration": i, "iteration_s": s}) + "\n" for i, s in enumerate(iteration_s))
    )
    ids = [f"t{i}" for i in range(len(before))]

    def ev(outcomes, seconds, boxed):
        c = sum(outcomes)
        return {
            "split": "arith1-eval",
            "accuracy": c / len(outcomes),
            "correct": c,
            "episodes": len(outcomes),
            "task_ids": ids,
            "outcomes": outcomes,
            "seconds": seconds,
            "behaviour": {"verifier": {"boxed_rate": boxed, "right_answer_rate": c / len(outcomes)}},
        }

    (path / "eval.json").write_text(json.dumps({"before": ev(before, 50.0, 0.5), "after": ev(after, 40.0, 0.75)}))
    return Run(path, path.name)


def test_comparison_tables_of_two_arms(tmp_path):
    base = [False] * 8 + [True] * 2
    coach = _write_run(tmp_path / "coach", "reinforce_pp", "rule", base, [True] * 7 + [False] + [True] * 2)
    outcome = _write_run(tmp_path / "outcome", "outcome", "none", base, [True] + [False] * 7 + [True, False])
    md = "\n".join(comparison_tables([coach, outcome]))
    # coach: 7 gained, 0 lost: p(gain) = 1/128, two-sided 2/128
    assert "| coach | reinforce_pp | rule | final-answer-key | arith1-eval | 20.0% [5.7%, 51.0%] (2/10) | 90.0%" in md
    assert "| 7 / 0 | 0.0156 | 0.00781 | 210 s (2 iterations) | 50 s + 40 s |" in md
    # outcome: 1 gained, 1 lost
    assert "| outcome | outcome | none | outcome | arith1-eval |" in md and "| 1 / 1 | 1 | 0.75 |" in md
    # after training, coach alone right in 7 episodes, outcome alone in 0 (both right in 2)
    assert "| coach vs outcome | 7 | 0 | 0.0156 | 10 episodes |" in md
    assert "| coach | verifier | 50% -> 75% | 20% -> 90% |" in md


def test_no_comparison_without_both_evaluations(tmp_path):
    run = _write_run(tmp_path / "a", "grpo", "rule", [True, False], [True, True])
    (run.path / "eval.json").write_text(json.dumps({"before": run.eval["before"]}))
    assert comparison_tables([Run(run.path)]) == []
