"""mappa/MathChat-v0 as a verifiers v1 environment (mappa_envs.integrations.verifiers_env; the package
deploy/verifiers, id ``mappa-mathchat``): loaded by id through verifiers' loader, and run by verifiers' own eval
command (``vf-eval``) against an OpenAI-compatible endpoint - a scripted one (every role's trace scored, with the
rewards the PettingZoo API gives the same actions; bad input recorded and counted). Its run against a real local
``vllm serve`` of the bundled model (issue 31's acceptance) is in test_vllm_serve, beside the other tests of that
one server.

Skipped, with the reason, only where verifiers is missing and not under CI (``CI`` set: the module fails)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

try:
    import verifiers.v1  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the extras installed
    MISSING = f"verifiers is not installed (pip install 'mappa-envs[verifiers]'): {e}"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        raise ImportError(f"required under CI: {MISSING}") from e

pytestmark = pytest.mark.skipif(bool(MISSING), reason=str(MISSING))

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "deploy" / "verifiers"
ROLES = ("problem_solver", "code_executor", "verifier")
TASKSET = ["--env.taskset.split", "arith1-eval", "--env.taskset.prompt-style", "small"]
TASKSET += ["--env.taskset.sandbox", "subprocess"]
SCRIPT = {
    ("problem_solver", 1): "2 + 3 = 5. \\boxed{5}",
    ("code_executor", 1): "```python\nprint(2 + 3)\n```",
    ("code_executor", 2): "The code printed 5.",
    ("verifier", 1): "The code printed 5. \\boxed{5}",
}


def role_and_turn(messages: list[dict]) -> tuple[str | None, int]:
    """Which MathChat role a chat request comes from (its system prompt), and its turn (1 + its scripted replies)."""
    from mappa_envs.tasks.mathchat import mathchat_roles

    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    role = next((r.name for r in mathchat_roles(prompt_style="small") if r.system_prompt.strip() == system), None)
    mine = set(SCRIPT.values())
    return role, 1 + sum(m["role"] == "assistant" and m.get("content") in mine for m in messages)


class ScriptedEndpoint:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 (a thread) answering with ``reply(messages)``: a string, or
    None for an HTTP 500. Every request body is kept in ``requests``."""

    def __init__(self, reply):
        self.reply, self.requests = reply, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "t"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(body)
                text = outer.reply(body["messages"])
                if text is None:
                    return self._send(500, {"error": {"message": "scripted failure", "type": "server_error"}})
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                created = int(time.time())
                self._send(
                    200,
                    {"id": "c", "object": "chat.completion", "created": created, "model": body["model"]}
                    | {"choices": [choice], "usage": usage},
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def vf_eval(url: str, model: str, out: Path, *args: str, timeout: int = 900) -> list[dict]:
    """``vf-eval mappa-mathchat`` (the console script beside this Python) against ``url``; the episodes it wrote."""
    script = Path(sys.executable).parent / "vf-eval"
    assert script.exists(), f"verifiers' eval command is missing beside {sys.executable}"
    cmd = [str(script), "mappa-mathchat", "-m", model, "--client.base-url", url, "--client.api-key-var"]
    cmd += ["MAPPA_VF_API_KEY", "--no-push", "-o", str(out), "--run.dir", "run", *TASKSET, *args]
    path = os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = dict(os.environ, PYTHONPATH=path, MAPPA_VF_API_KEY="EMPTY", HF_HUB_OFFLINE="1", NO_COLOR="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=out.parent)
    assert done.returncode == 0, f"vf-eval failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return [json.loads(line) for line in (out / "run" / "traces.jsonl").read_text().splitlines() if line.strip()]


def pettingzoo_rewards(task_id: str, actions: list[str]) -> tuple[dict, list[float]]:
    """The same actions through the PettingZoo API with the rule coach: each agent's summed rewards, each action's."""
    import mappa_envs
    from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach

    env = mappa_envs.make("mappa/MathChat-v0", split="arith1-eval", prompt_style="small", sandbox="subprocess")
    env = CoachRewardWrapper(env, RuleBasedCoach(), blocking=True)
    env.reset(options={"task_id": task_id})
    totals = dict.fromkeys(env.possible_agents, 0.0)
    for action in actions:
        env.step(action)
        for a in totals:
            totals[a] += env.rewards.get(a, 0.0)
    rewards = [a.reward for a in env.unwrapped.record.actions]
    env.close()
    return totals, rewards


def test_loaded_by_id_through_verifiers_loader(monkeypatch):
    import verifiers.v1 as vf

    monkeypatch.syspath_prepend(str(PACKAGE))
    taskset = {"id": "mappa-mathchat", "split": "arith1-eval", "sandbox": "subprocess"}
    config = vf.resolve_env_config({"taskset": taskset})
    env = vf.load_environment(config)
    assert type(env).__name__ == "MathChatEnv" and config.coach == "rule" and config.traces == "agent"
    assert set(config.agent_harnesses()) == set(ROLES)
    assert {h.id for h in config.agent_harnesses().values()} == {"mappa-mathchat"}
    tasks = list(env.taskset.take(2))
    assert [t.data.task_index for t in tasks] == [0, 1] and tasks[0].data.id == "arith1-eval/1"
    sealed = vf.resolve_env_config({"taskset": {"id": "mappa-mathchat", "split": "arith2-test-1step"}})
    with pytest.raises(Exception, match="sealed"):  # a sealed test split is refused here as everywhere
        list(vf.load_environment(sealed).taskset)


@pytest.mark.slow
def test_vf_eval_scores_every_role_as_the_pettingzoo_api_does(tmp_path):
    """2 episodes through ``vf-eval`` with scripted replies: three traces each, one per role, trainable, each rewarded
    with its agent's summed rule-coach rewards - equal to the same actions through the PettingZoo API."""

    def reply(messages):
        return SCRIPT[role_and_turn(messages)]

    with ScriptedEndpoint(reply) as endpoint:
        episodes = vf_eval(endpoint.url, "scripted", tmp_path / "out", "-n", "2", "-r", "1")
    assert len(episodes) == 2 and len(endpoint.requests) == 8
    actions = [SCRIPT[k] for k in (("problem_solver", 1), ("code_executor", 1), ("code_executor", 2), ("verifier", 1))]
    for episode in episodes:
        assert episode["ok"], episode["errors"]
        traces = {t["agent"]["name"]: t for t in episode["traces"]}
        assert sorted(traces) == sorted(ROLES)
        mappa = traces["verifier"]["info"]["mappa"]
        totals, rewards = pettingzoo_rewards(mappa["task_id"], actions)
        assert mappa["episode_rewards"] == pytest.approx(totals)
        for role, trace in traces.items():
            assert trace["agent"]["trainable"] and trace["ok"]
            assert trace["rewards"]["coach"]["score"] == pytest.approx(totals[f"{role}_0"])
            entries = trace["info"]["mappa"]["actions"]
            assert [e["reward"] for e in entries] == pytest.approx([rewards[e["index"]] for e in entries])
            assert all(not e["coach"]["fallback_used"] and not e["issues"] for e in entries)
            assert trace["metrics"]["actions"] == (2 if role == "code_executor" else 1)
            assert len(trace["calls"]) == trace["metrics"]["actions"]  # every reply went through verifiers' record


@pytest.mark.slow
def test_bad_input_is_recorded_and_counted_never_a_silent_default(tmp_path):
    """One trace per action (``--env.traces action``), the verifier frozen. The solver's reply is empty (the env's
    malformed action), the code executor gets an HTTP 500 (no reply: given to the env as no action, recorded with
    why), and the LLM coach (the same endpoint) replies without a score (its flagged fallback): each shows in the
    trace and is counted."""

    def reply(messages):
        role, _ = role_and_turn(messages)
        return {"problem_solver": "", "code_executor": None}.get(role, "I like this answer. \\boxed{5}")

    with ScriptedEndpoint(reply) as endpoint:
        coach = f"llm:scripted@{endpoint.url}"
        args = ["-n", "1", "--env.traces", "action", "--env.coach", coach, "--env.retries.max-retries", "0"]
        args += ["--env.frozen", "verifier"]
        (episode,) = vf_eval(endpoint.url, "scripted", tmp_path / "out", *args)
    traces = {t["agent"]["name"]: t for t in episode["traces"]}
    assert sorted(traces) == sorted(ROLES) and len(episode["traces"]) == 3  # no code ran: one executor action
    for trace in traces.values():
        (entry,) = trace["info"]["mappa"]["actions"]
        assert trace["rewards"]["coach"]["score"] == pytest.approx(entry["reward"])
        assert entry["coach"]["fallback_used"] and entry["coach"]["fallback_reason"]
        assert trace["metrics"]["coach_fallbacks"] == 1
    solver = traces["problem_solver"]
    assert "empty action" in solver["info"]["mappa"]["actions"][0]["issues"]
    assert solver["metrics"]["malformed_actions"] == 1 and solver["ok"]
    executor = traces["code_executor"]
    issues = executor["info"]["mappa"]["actions"][0]["issues"]
    assert "action was None" in issues and any(i.startswith("verifiers: no reply") for i in issues), issues
    assert executor["metrics"]["missing_replies"] == 1 and not executor["ok"] and executor["errors"]
    assert traces["verifier"]["metrics"]["missing_replies"] == 0
    assert [traces[r]["agent"]["trainable"] for r in ROLES] == [True, True, False]  # the frozen verifier


def test_the_core_package_does_not_import_verifiers():
    code = "import sys, mappa_envs, mappa_envs.integrations; assert 'verifiers' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
