"""mappa report run: a report of two training runs renders, with real PNG figures and a self-contained HTML."""

import importlib.util

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None or importlib.util.find_spec("matplotlib") is None,
        reason="needs the 'models' and 'report' extras",
    ),
]


def _run(path, estimator):
    from baselines.training.local_trainer import LocalTrainer, TrainConfig
    from baselines.weights.models import tiny_model_dir

    cfg = TrainConfig(
        model=str(tiny_model_dir()),
        estimator=estimator,
        iterations=2,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=8,
        lr=1e-3,
        out_dir=str(path),
        coach="none" if estimator == "outcome" else "mappa_envs.coach:LengthCoach",
        truncated="keep",
        progress=False,
    )
    trainer = LocalTrainer(cfg)
    trainer.train()
    trainer.close()


def test_report_of_a_process_and_an_outcome_run(tmp_path):
    from benchmarks.cli import main

    _run(tmp_path / "coach", "reinforce_pp")
    _run(tmp_path / "outcome", "outcome")
    out = tmp_path / "report"
    argv = ["report", "run", str(tmp_path / "coach"), str(tmp_path / "outcome"), "--label", "coach"]
    assert main([*argv, "--label", "outcome", "--out", str(out)]) == 0
    for name in ("curves.png", "coach_scores.png", "coach_bias.png", "calibration.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    md = (out / "report.md").read_text()
    assert "| coach | 2 |" in md and "| outcome | 2 |" in md and "![" in md
    assert "code_executor" in md and "## Coach bias (tables)" in md
    # the coach's work and the masked actions, summed over the iterations (2 x 4 episodes, 1 solver action each):
    # 8 evaluations and no request (a rule coach asks no model), 8 truncated responses kept (truncated="keep")
    assert (
        "## Coach faults and masked actions" in md
        and "| coach | problem_solver | 8 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 8 | 0 | 0 | 0 | 0 | 0 |" in md
    )
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "<table>" in page
