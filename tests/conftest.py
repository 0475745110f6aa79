import os

import pytest

# Tests never reach model hubs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Envs built without a sandbox argument run their code in plain subprocesses here: those tests check environments,
# coaches and trainers, and a container per episode would triple the suite's time. The isolating backends have
# their own tests (test_sandbox_*, every env on Docker and bubblewrap, the default's choice of Docker), and `.ci/run`
# trains the smoke preset on the default (isolated) backend as users do. MAPPA_SANDBOX=docker runs all of it there.
os.environ.setdefault("MAPPA_SANDBOX", "subprocess")
# A test that evaluates a sealed test split logs its look to a file of its own, never to the committed
# docs/runs/test-access.jsonl (mappa_envs.sealed), whatever the test asks for.
os.environ["MAPPA_TEST_ACCESS_LOG"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"mappa-test-access-{os.getpid()}.jsonl"
)


def pytest_configure(config):
    """Where the isolating backends are required (``$MAPPA_REQUIRE_BACKENDS``, or CI), a missing one fails the run
    at once, with what is missing and how to install it: the isolation tests never skip unnoticed."""
    from sandboxes.check import missing_required

    missing = missing_required()
    if missing:
        why = "isolating sandbox backends required (MAPPA_REQUIRE_BACKENDS or CI) but missing:\n  "
        pytest.exit(why + "\n  ".join(missing), returncode=3)


@pytest.fixture
def mathchat():
    import mappa_envs

    env = mappa_envs.make("mappa/MathChat-v0", split="amc-eval-32")
    yield env
    env.close()


def _stored_episodes(path, n=3):
    """``n`` MathChat episodes scored by the rule coach during the rollout, written as a trajectory file."""
    import mappa_envs
    from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach
    from mappa_envs.core import write_jsonl

    replies = {
        "problem_solver": "Add them: 6 + 7 = 13. \\boxed{13}",
        "code_executor": "```python\nprint(6 + 7)\n```",
        "verifier": "The code printed 13. \\boxed{13}",
    }
    records = []
    for i in range(n):
        env = CoachRewardWrapper(
            mappa_envs.make("mappa/MathChat-v0", split="arith1-eval", prompt_style="small"),
            RuleBasedCoach(),
            blocking=True,
        )
        env.reset(seed=i, options={"task_index": i})
        for agent in env.agent_iter():
            _, _, term, trunc, _ = env.last()
            env.step(None if term or trunc else replies[env.unwrapped.role(agent).name])
        records.append(env.unwrapped.record)
        env.close()
    write_jsonl(path, records)
    return records


@pytest.fixture
def stored_episodes():
    """A function writing ``n`` MathChat episodes (scored by the rule coach during the rollout) to a file."""
    return _stored_episodes


REAL_CONTAINER = ("docker", "bubblewrap")


RAY_CLUSTER = (
    "tests/test_ray_trainer.py",
    "tests/test_gpu_layouts.py",
)
"""Tests that start a Ray cluster and the trainer's engines and ranks: under ``pytest -n`` (``make test``) they form
one group, run one after the other on one worker, while the other worker takes the rest."""
LONGEST_FIRST = (
    "ray-cluster",
    "tests/test_vllm_serve.py",
    "tests/test_run_bundled_model.py",
    "tests/test_sandbox_hostile.py",
    "tests/test_dsbench.py",
)
"""The groups that take longest (``--durations`` of a full run), handed out first: the run ends when the longest
group does, not when a long group started last does."""


def group_of(nodeid: str) -> str:
    """The unit a worker takes whole: ``ray-cluster`` for :data:`RAY_CLUSTER`, else the test's module (its
    module-scoped fixtures - a ``vllm serve``, a trained model, a sandbox per backend - are then set up once)."""
    bare = nodeid.split("[")[0]
    if any(bare == name or bare.startswith(name + "::") for name in RAY_CLUSTER):
        return "ray-cluster"
    return nodeid.split("::")[0]


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (``make test``: ``-n 2``) hands out :func:`group_of` units, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # keep LONGEST_FIRST's order (not "most tests first")
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests that start real containers (a Docker or bubblewrap sandbox: the marker ``docker``, or a parameter id
    naming the backend) are ``slow``: ``make test-fast`` leaves them to ``make test``. The groups of
    :data:`LONGEST_FIRST` are collected first, in that order (each group's tests keep theirs)."""
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))
    _repeat(items, os.environ.get("MAPPA_REPEAT_TEST", ""))
    for item in items:
        callspec = getattr(item, "callspec", None)
        ids = callspec.id.split("-") if callspec is not None else []
        if item.get_closest_marker("docker") or any(backend in ids for backend in REAL_CONTAINER):
            item.add_marker(pytest.mark.slow)


def _repeat(items: list, spec: str) -> None:
    """``MAPPA_REPEAT_TEST=NODEID=N``: that test runs N times in a row at its place in the suite's order (a flaky
    test looped where the whole suite runs it, after what runs before it); an id that matches nothing is an error."""
    if not spec:
        return
    nodeid, _, times = spec.rpartition("=")
    where = [i for i, item in enumerate(items) if item.nodeid == nodeid]
    if not where or not times.isdigit():
        raise pytest.UsageError(f"MAPPA_REPEAT_TEST={spec!r}: give NODEID=N with a collected test's id")
    item = items[where[0]]
    kwargs = {"name": item.name, "originalname": item.originalname, "callobj": item.obj}
    if hasattr(item, "callspec"):
        kwargs["callspec"] = item.callspec
    copies = [type(item).from_parent(item.parent, **kwargs) for _ in range(int(times) - 1)]
    items[where[0] + 1 : where[0] + 1] = copies  # new items (the runner sets each up and tears it down)


def _machine_cpu_seconds() -> float:
    """CPU seconds all cores of the machine spent busy since boot (``/proc/stat``), for the per-test profile."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``MAPPA_TEST_PROFILE=FILE``: one JSON line per test (wall seconds, busy CPU seconds of the whole machine)
    appended as it ends, to see where the suite's time goes and how much of it waits instead of computing."""
    path = os.environ.get("MAPPA_TEST_PROFILE")
    if not path:
        yield
        return
    import json
    import time

    t0, c0 = time.monotonic(), _machine_cpu_seconds()
    yield
    row = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - t0, 2),
        "cpu_s": round(_machine_cpu_seconds() - c0, 2),
    }
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
