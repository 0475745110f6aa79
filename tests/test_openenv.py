"""The envs served over OpenEnv (mappa_envs.integrations.openenv_server): whole MathChat episodes through the real
OpenEnv client, 8 sessions at once, equal to the same actions through the PettingZoo API; seat mode; malformed
actions; a killed client's session released; a busy server; OpenEnv's runtime validation; the CLI's parser.

Skipped, with the reason, only where openenv-core is missing and not under CI (``CI`` set: the module fails)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

try:
    import openenv.core  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the extras installed
    MISSING = f"openenv-core is not installed (pip install 'mappa-envs[openenv]'): {e}"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        raise ImportError(f"required under CI: {MISSING}") from e

pytestmark = pytest.mark.skipif(bool(MISSING), reason=str(MISSING))

TASKS = [{"id": f"t{j}", "prompt": f"What is {10 + j} + {3 * j}?", "answer": 10 + 4 * j} for j in range(4)]
ENV_KWARGS = {"tasks": TASKS, "sandbox": "subprocess"}
AGENTS = ["problem_solver_0", "code_executor_0", "code_executor_0", "verifier_0"]


def replies(i: int) -> list[str]:
    """Session ``i``'s scripted actions on task ``i % 4``: right answers for i < 4, a wrong final answer after."""
    j = i % 4
    answer = 10 + 4 * j
    final = answer if i < 4 else answer + 1
    return [
        f"Add them: \\boxed{{{answer}}}",
        f"```python\nprint({10 + j} + {3 * j})\n```",
        "The code printed the sum.",
        f"The code agrees. \\boxed{{{final}}}",
    ]


def pettingzoo_episode(i: int, coach=None) -> dict:
    """The same actions through the PettingZoo API: outcome, each agent's summed rewards, each action's reward."""
    import mappa_envs
    from mappa_envs.coach import CoachRewardWrapper

    env = mappa_envs.make("mappa/MathChat-v0", **ENV_KWARGS)
    if coach is not None:
        env = CoachRewardWrapper(env, coach, blocking=True)
    env.reset(seed=i, options={"task_index": i % 4})
    totals = dict.fromkeys(env.possible_agents, 0.0)
    script = iter(replies(i))
    for _agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        env.step(next(script))
        for a in totals:
            totals[a] += env.rewards.get(a, 0.0)
    record = env.unwrapped.record
    env.close()
    return {"outcome": record.outcome, "totals": totals, "rewards": [a.reward for a in record.actions]}


@pytest.fixture(scope="module")
def coached_server():
    from mappa_envs.coach import RuleBasedCoach
    from mappa_envs.integrations.openenv_server import RunningServer, create_mappa_app

    app = create_mappa_app("mappa/MathChat-v0", env_kwargs=ENV_KWARGS, coach=RuleBasedCoach(), max_sessions=8)
    with RunningServer(app) as server:
        yield server


async def _play(url: str, i: int):
    from mappa_envs.integrations.openenv_models import MappaEnvClient

    seen = []
    async with MappaEnvClient(base_url=url) as env:
        result = await env.reset(seed=i, task_index=i % 4)
        for reply in replies(i):
            seen.append(result.observation.agent)
            result = await env.step(reply)
        state = await env.state()
    return seen, result, state


def test_eight_sessions_at_once_equal_the_pettingzoo_api(coached_server):
    from mappa_envs.coach import RuleBasedCoach

    async def all_sessions():
        return await asyncio.gather(*(_play(coached_server.url, i) for i in range(8)))

    results = asyncio.run(all_sessions())
    for i, (seen, result, state) in enumerate(results):
        expected = pettingzoo_episode(i, RuleBasedCoach())
        info = result.observation.info
        assert seen == AGENTS
        assert result.done and state.done and state.actions == 4
        assert info["task_id"] == state.task_id == f"custom/t{i % 4}"  # no crosstalk: each session its own task
        assert info["outcome"] == expected["outcome"]
        assert info["outcome"]["correct"] is (i < 4)
        assert info["episode_rewards"] == pytest.approx(expected["totals"])
        assert [a["reward"] for a in info["record"]] == pytest.approx(expected["rewards"])
        assert all(a["coach"]["fallback_used"] is False for a in info["record"])
        assert result.reward == pytest.approx(info["rewards"]["verifier_0"])
        assert result.observation.metadata == info  # the client puts info back into OpenEnv's metadata
    assert released()  # every session's env closed when its client left


def released(timeout_s: float = 15.0, path=None) -> bool:
    """Whether, within ``timeout_s``, every session's env is closed (and ``path`` is gone)."""
    from mappa_envs.integrations.openenv_env import open_environments

    deadline = time.monotonic() + timeout_s
    while open_environments() or (path is not None and path.exists()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_seat_mode_plays_the_other_roles_server_side():
    from mappa_envs.core import ScriptedPolicy
    from mappa_envs.integrations.openenv_models import MappaEnvClient
    from mappa_envs.integrations.openenv_server import RunningServer, create_mappa_app

    script = replies(5)  # the verifier is wrong: outcome 0
    others = {"problem_solver": ScriptedPolicy([script[0]]), "verifier": ScriptedPolicy([script[3]])}
    app = create_mappa_app("mappa/MathChat-v0", env_kwargs=ENV_KWARGS, seat="code_executor", others=others)
    with RunningServer(app) as server, MappaEnvClient(base_url=server.url).sync() as env:
        result = env.reset(seed=5, task_index=1)
        obs = result.observation
        assert (obs.agent, obs.role, obs.info["seat"]) == ("code_executor_0", "code_executor", "code_executor")
        assert [a["agent"] for a in obs.info["acted"]] == ["problem_solver_0"]
        assert "Add them" in obs.text and obs.messages[-1]["role"] == "user"
        result = env.step(script[1])
        assert result.observation.agent == "code_executor_0" and not result.done  # its second turn
        result = env.step(script[2])
        assert result.done
        assert [a["agent"] for a in result.observation.info["acted"]] == ["code_executor_0", "verifier_0"]
    expected = pettingzoo_episode(5)
    assert result.observation.info["outcome"] == expected["outcome"]
    assert result.observation.info["episode_rewards"] == pytest.approx(expected["totals"])
    assert result.reward == pytest.approx(expected["totals"]["code_executor_0"])


def test_seat_mode_refuses_missing_policies_and_unknown_roles():
    from mappa_envs.core import ScriptedPolicy
    from mappa_envs.integrations.openenv_server import create_mappa_app

    with pytest.raises(ValueError, match=r"no policy for the roles \['verifier'\]"):
        others = {"problem_solver": ScriptedPolicy(["x"])}
        create_mappa_app("mappa/MathChat-v0", env_kwargs=ENV_KWARGS, seat="code_executor", others=others)
    with pytest.raises(ValueError, match="no role 'judge'"):
        create_mappa_app("mappa/MathChat-v0", env_kwargs=ENV_KWARGS, seat="judge", others=ScriptedPolicy(["x"]))


@pytest.fixture(scope="module")
def small_server():
    from mappa_envs.integrations.openenv_server import RunningServer, create_mappa_app

    app = create_mappa_app("mappa/MathChat-v0", env_kwargs=ENV_KWARGS, max_sessions=2, max_action_chars=1000)
    with RunningServer(app) as server:
        yield server


def _ws(url: str):
    from websockets.sync.client import connect

    return connect(url.replace("http://", "ws://") + "/ws", max_size=2**26)


def _ask(ws, message) -> dict:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=60))


def test_malformed_actions_get_an_error_are_recorded_and_the_session_goes_on(small_server):
    from mappa_envs.integrations.openenv_models import MappaAction, MappaEnvClient

    with _ws(small_server.url) as ws:  # what no client sends: errors, and the session stays
        assert _ask(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert _ask(ws, {"type": "step", "data": [1, 2]})["data"]["code"] == "VALIDATION_ERROR"
        assert _ask(ws, {"type": "jump"})["data"]["code"] == "UNKNOWN_TYPE"
        assert _ask(ws, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        answer = _ask(ws, {"type": "step", "data": {"txt": "hello"}})  # a wrong shape: the solver's turn
        assert answer["type"] == "observation"
        assert "unknown fields ['txt']" in answer["data"]["observation"]["error"]
        assert answer["data"]["observation"]["agent"] == "code_executor_0"

    with MappaEnvClient(base_url=small_server.url).sync() as env:
        env.reset(seed=0, task_index=0)
        shape = env.step(MappaAction(text=["not", "text"]))
        raw = env.step(b"\xff\xfe print(1)")  # bytes: the code executor's turn (no code: its turns end)
        huge = env.step("\\boxed{10} " + "x" * 200_000)  # the verifier, cut to max_action_chars=1000
    assert "'text' is a list, not a string" in shape.observation.error
    assert "11 bytes: decoded as UTF-8 with replacement" in raw.observation.error
    assert "a reply of 200011 characters is cut to 1000" in huge.observation.error
    assert huge.done
    issues = [a["issues"] for a in huge.observation.info["record"]]
    assert "action was a list, converted with str()" in issues[0]  # the env's own record of a malformed action
    assert any("openenv: 'text' is a list" in x for x in issues[0])
    assert "action was 11 bytes, decoded as UTF-8 with replacement" in issues[1]
    assert any("cut to 1000" in x for x in issues[2])
    assert huge.observation.info["outcome"]["predicted"] == "10"  # the cut reply still graded


KILLED_CLIENT = """
import sys, time
from mappa_envs.integrations.openenv_models import MappaEnvClient
env = MappaEnvClient(base_url=sys.argv[1]).sync()
env.reset(seed=0, task_index=0)
env.step("\\\\boxed{10}")
env.step("```python\\nopen('left.txt', 'w').write('x')\\nprint(10)\\n```")
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # a client process started and killed (~5 s)
def test_a_killed_client_has_its_session_env_and_workspace_released(small_server):
    from mappa_envs.integrations.openenv_env import open_environments

    assert released()  # the earlier tests' sessions
    command = [sys.executable, "-c", KILLED_CLIENT, small_server.url]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        (served,) = open_environments()
        workspace = served.env.unwrapped.session.workspace
        assert (workspace / "left.txt").exists()
    finally:
        child.kill()
        child.wait()
    assert released(path=workspace) and served._closed


def test_a_full_server_answers_busy(small_server):
    from mappa_envs.integrations.openenv_models import MappaEnvClient

    first, second = MappaEnvClient(base_url=small_server.url).sync(), MappaEnvClient(base_url=small_server.url).sync()
    with first, second:
        first.reset(seed=0)
        second.reset(seed=0)
        with _ws(small_server.url) as ws:  # the server's first word to a third connection
            answer = json.loads(ws.recv(timeout=30))
        assert answer["type"] == "error" and answer["data"]["code"] == "CAPACITY_REACHED"
        assert "Server at capacity: 2/2 sessions active" in answer["data"]["message"]
        for _ in range(3):  # through the client, whether its request goes out before the server closes or not
            with pytest.raises(RuntimeError, match=r"Server at capacity: 2/2 sessions.*CAPACITY_REACHED"):
                MappaEnvClient(base_url=small_server.url).sync().reset(seed=0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the sessions are released: a new client gets one
        try:
            with MappaEnvClient(base_url=small_server.url).sync() as third:
                assert third.reset(seed=0).observation.agent == "problem_solver_0"
            break
        except RuntimeError:
            time.sleep(0.1)
    else:
        pytest.fail("no session after the two clients left")


def test_openenv_runtime_validation_passes(small_server):
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(small_server.url, timeout_s=30)
    assert report["passed"], json.dumps(report["criteria"], indent=1)
    metadata = json.loads(_get(small_server.url + "/metadata"))
    assert metadata["name"] == "mappa/MathChat-v0" and "problem solver" in metadata["description"]


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.read().decode()


def test_the_cli_builds_the_server_from_its_options():
    from benchmarks.commands.serve import policies_from_args
    from mappa_envs.core import ScriptedPolicy, SerialPolicy

    others = policies_from_args(["verifier=scripted:\\boxed{1}", "problem_solver=scripted:hi"])
    assert isinstance(others["verifier"], SerialPolicy) and isinstance(others["verifier"].policy, ScriptedPolicy)
    assert others["verifier"].generate([[]]) == ["\\boxed{1}"]
    with pytest.raises(SystemExit, match="ROLE=MODEL@URL, ROLE=run:RUN_DIR, ROLE=model:NAME_OR_PATH or ROLE=scripted"):
        policies_from_args(["verifier=nothing"])
    with pytest.raises(SystemExit, match="holds no exported model"):
        policies_from_args(["verifier=run:/nonexistent-run"])


def test_the_cli_refuses_a_wrong_seat_before_loading_any_model(monkeypatch):
    """``mappa env serve --seat ... --policy ROLE=model:...``: an unknown seat or a role left without a policy is
    refused before the policies are built (a local model can take minutes to load)."""
    import argparse

    from benchmarks.commands import serve

    def no_models(*args, **kwargs):
        raise AssertionError("policies were built before the seat was checked")

    monkeypatch.setattr(serve, "policies_from_args", no_models)
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    base = ["env", "serve", "mappa/MathChat-v0", "--sandbox", "subprocess"]
    missing = parser.parse_args([*base, "--seat", "code_executor", "--policy", "problem_solver=model:smollm2-135m"])
    with pytest.raises(
        SystemExit, match=r"mappa env serve: seat 'code_executor': no policy for the roles \['verifier'\]"
    ):
        missing.func(missing)
    unknown = parser.parse_args([*base, "--seat", "judge", "--policy", "verifier=model:smollm2-135m"])
    with pytest.raises(SystemExit, match="no role 'judge'"):
        unknown.func(unknown)


def test_a_runs_exported_models_play_the_other_roles(tmp_path):
    """``--policy ROLE=run:RUN_DIR``: the model a run exported for ROLE (here the tiny random model copied where
    ``mappa train`` exports) plays it server-side, through the same seat-mode episode as a scripted policy; two
    roles on one model share one policy and one lock."""
    import shutil

    from baselines.weights.models import tiny_model_dir
    from benchmarks.commands.serve import policies_from_args
    from mappa_envs.core import SerialPolicy
    from mappa_envs.integrations.openenv_models import MappaEnvClient
    from mappa_envs.integrations.openenv_server import RunningServer, create_mappa_app

    for role in ("problem_solver", "verifier"):
        shutil.copytree(tiny_model_dir(), tmp_path / "models" / role)
    items = [f"problem_solver=run:{tmp_path}", f"verifier=model:{tmp_path / 'models' / 'problem_solver'}"]
    others = policies_from_args(items, max_tokens=8, engine="transformers")
    assert all(isinstance(p, SerialPolicy) for p in others.values())
    assert others["problem_solver"] is others["verifier"]  # one model folder: one policy behind one lock
    kwargs = {**ENV_KWARGS, "code_executor_turns": 1}
    app = create_mappa_app("mappa/MathChat-v0", env_kwargs=kwargs, seat="code_executor", others=others)
    with RunningServer(app) as server, MappaEnvClient(base_url=server.url).sync() as env:
        result = env.reset(seed=0, task_index=0)
        assert [a["agent"] for a in result.observation.info["acted"]] == ["problem_solver_0"]
        result = env.step("```python\nprint(10 + 0)\n```")
    assert result.done and [a["agent"] for a in result.observation.info["record"]] == [
        "problem_solver_0",
        "code_executor_0",
        "verifier_0",
    ]
    assert result.observation.info["outcome"]["success"] is False  # a random model does not box 10


def test_the_openenv_package_passes_openenv_validate():
    """deploy/openenv: what ``openenv validate deploy/openenv`` checks (pyproject's server script, uv.lock,
    server/app.py's main), and its app module builds the server."""
    import importlib.util
    from pathlib import Path

    from openenv.cli._validation import validate_multi_mode_deployment

    package = Path(__file__).resolve().parents[1] / "deploy" / "openenv"
    assert validate_multi_mode_deployment(package) == (True, [])
    assert (package / "Dockerfile").exists() and "app: server.app:app" in (package / "openenv.yaml").read_text()
    spec = importlib.util.spec_from_file_location("mappa_openenv_app", package / "server" / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ENV_ID == "mappa/MathChat-v0" and callable(module.main)
    assert any(getattr(route, "path", None) == "/ws" for route in module.app.routes)


@pytest.mark.slow  # a server process started (~5 s)
def test_mappa_env_serve_runs_a_server_that_openenv_validates(tmp_path):
    import socket

    from openenv.cli._validation import validate_running_environment

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tasks = json.dumps(TASKS)
    command = [sys.executable, "-m", "benchmarks.cli", "env", "serve", "mappa/MathChat-v0", "--port", str(port)]
    command += ["--env-arg", f"tasks={tasks}", "--sandbox", "subprocess", "--coach", "rule"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # its imports take ~20 s on a loaded machine
        while True:
            try:
                assert json.loads(_get(url + "/health"))["status"] == "healthy"
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()
                time.sleep(0.2)
        report = validate_running_environment(url, timeout_s=30)
        assert report["passed"], json.dumps(report["criteria"], indent=1)
        assert asyncio.run(_play(url, 0))[1].observation.info["outcome"]["correct"]
    finally:
        server.terminate()
        server.wait(timeout=30)
