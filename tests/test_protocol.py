"""The benchmark protocol (issue 19): tracks, result files with provenance validated on load, the leaderboard with
paired tests, and refusal to rank different protocol versions together."""

import json
import re

import pytest

from baselines.evaluation.protocol import (
    PROTOCOLS,
    format_leaderboard,
    leaderboard,
    load_result,
    result_record,
    track,
    validate_result,
)


class _Sum:
    """Every role boxes a + b (+ ``off`` on problems whose index is odd): a scripted team."""

    def __init__(self, off: int = 0):
        self.off = off

    def generate(self, batch):
        replies = []
        for conversation in batch:
            problem = next(m["content"] for m in conversation if m["role"] == "user" and m.get("name") != "example")
            numbers = [int(x) for x in re.findall(r"\d+", problem)[:2]]
            replies.append(f"\\boxed{{{sum(numbers) + self.off}}}")
        return replies


def _result(tmp_path, off, name):
    from baselines.evaluation.evaluate import EvalConfig, evaluate

    t = track("mappa-bench-v1", "mathchat-cpu")
    cfg = EvalConfig(
        suites=t.suites,
        k=t.k,
        temperature=t.temperature,
        sandbox="subprocess",
        mathchat_kwargs=dict(t.env_kwargs),
        concurrency=16,
    )
    result = evaluate(_Sum(off), cfg, log=lambda *_: None)
    return result_record("mappa-bench-v1", "mathchat-cpu", result, {"name": name}, run_dir=None, seeds=[0])


def test_result_files_and_the_leaderboard(tmp_path):
    assert track("mappa-bench-v1", "mathchat-cpu").suites == ("mathchat:arith1-eval",)
    with pytest.raises(ValueError, match="no track"):
        track("mappa-bench-v1", "chess")
    a, b = _result(tmp_path, 0, "adds"), _result(tmp_path, 1, "off-by-one")
    assert validate_result(a) == [] and a["scores"]["mathchat:arith1-eval"]["episodes"] == 128
    assert a["code_version"] and a["hardware"]["cpus"] and a["protocol"] == "mappa-bench-v1"
    path = tmp_path / "a.json"
    path.write_text(json.dumps(a))
    assert load_result(path)["method"]["name"] == "adds"
    broken = {k: v for k, v in a.items() if k != "seeds"}
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="missing 'seeds'"):
        load_result(path)
    board = leaderboard([b, a])
    rows = board["suites"]["mathchat:arith1-eval"]
    assert [r["method"] for r in rows] == ["adds", "off-by-one"]  # ranked by score
    assert rows[0]["score"] > rows[1]["score"] and rows[1]["vs_above"]["p_value"] < 0.05
    assert "| 1 | adds | undeclared |" in format_leaderboard(board)  # a method that does not say what it saw
    a["method"]["information"] = "final-answer-key"
    assert "| 1 | adds | final-answer-key |" in format_leaderboard(leaderboard([b, a]))
    other = {**b, "protocol": "mappa-bench-v0"}
    with pytest.raises(ValueError, match="different protocol versions"):
        leaderboard([a, other])


def test_mappa_eval_under_the_protocol_writes_a_valid_result_file(tmp_path, monkeypatch):
    """`mappa eval --protocol mappa-bench-v1 --track mathchat-cpu --run RUN` (the team's policies scripted here;
    the engines are those of every `mappa eval`); then `mappa report compare` renders the leaderboard."""
    import baselines.evaluation.teams
    from benchmarks.cli import main

    run = tmp_path / "run"
    for role in ("problem_solver", "code_executor", "verifier"):
        (run / "models" / role).mkdir(parents=True)
        (run / "models" / role / "config.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"seed": 3, "env_kwargs": {"split": "arith1-train"}}))
    (run / "metrics.jsonl").write_text(json.dumps({"episodes": 16, "gen_tok_s": 100.0, "rollout_s": 2.0}) + "\n")
    monkeypatch.setattr(baselines.evaluation.teams, "build_policies", lambda team, cfg, engines=None: _Sum(0))
    out = tmp_path / "eval"
    argv = ["eval", "--protocol", "mappa-bench-v1", "--track", "mathchat-cpu", "--sandbox", "subprocess"]
    assert main([*argv, "--run", str(run), "--out", str(out)]) == 0
    result = load_result(out / "result.json")
    assert result["method"]["name"] == "run" and result["seeds"] == [3]
    assert result["budget_spent"]["episodes"] == 16 and result["budget_spent"]["generated_tokens"] == 200
    assert 0.2 < result["scores"]["mathchat:arith1-eval"]["score"] < 0.6  # the sums among the problems
    with pytest.raises(SystemExit, match="in full"):
        main(["eval", "--protocol", "mappa-bench-v1", "--track", "mathchat-cpu", "--limit", "3"])
    assert main(["report", "compare", str(out / "result.json"), "--out", str(tmp_path / "board")]) == 0
    assert "| 1 | run |" in (tmp_path / "board" / "leaderboard.md").read_text()
    assert "<table>" in (tmp_path / "board" / "leaderboard.html").read_text()
    assert set(PROTOCOLS["mappa-bench-v1"].tracks) >= {"mathchat-cpu", "dsbench-lite"}
