"""Advantage estimators against values computed by hand."""

import pytest
import torch

from baselines.algorithm.advantages import (
    ESTIMATORS,
    AdvantageBatch,
    compute_advantages,
    returns_to_go,
    token_rewards,
)


def whiten(values, mask):
    vals = [v for v, m in zip(values, mask, strict=True) if m]
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
    return [((v - mean) / (std + 1e-6)) if m else 0.0 for v, m in zip(values, mask, strict=True)]


def test_token_rewards_and_returns_by_hand():
    # two samples: 3 and 2 response tokens (right-padded to 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -1.0, 0.0]])
    batch = AdvantageBatch(torch.tensor([0.7, 0.2]), torch.tensor([1.0, 0.0]), mask, logp, ref)
    r = token_rewards(batch.rewards, batch, beta=0.1)
    # KL_t = logp - ref: [[0.5, 0, 0.5], [-0.5, 0, .]]; r_t = -0.1 KL_t, + reward on the last token
    expected = torch.tensor([[-0.05, 0.0, -0.05 + 0.7], [0.05, 0.0 + 0.2, 0.0]])
    assert torch.allclose(r, expected)
    g = returns_to_go(r, mask.float())
    assert torch.allclose(g, torch.tensor([[0.60, 0.65, 0.65], [0.25, 0.20, 0.0]]))


def test_reinforce_pp_normalises_over_the_global_batch():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = AdvantageBatch(torch.tensor([0.7, 0.2]), torch.tensor([1.0, 0.0]), mask)
    adv = compute_advantages("reinforce_pp", batch, beta=0.0)
    # without KL the returns are the reward on every token: [.7 .7 .7 | .2 .2 -]
    flat = whiten([0.7, 0.7, 0.7, 0.2, 0.2, 0.0], [1, 1, 1, 1, 1, 0])
    assert torch.allclose(adv.flatten(), torch.tensor(flat), atol=1e-6)
    assert adv[1, 2] == 0


def test_constant_rewards_give_zero_advantages():
    # every sample scored 3/10 and no KL: nothing to learn. float32 rounding of the mean must not be amplified
    # into advantages of order 1 (it was, with eps 1e-8 in float32).
    mask = torch.ones(4, 17)
    batch = AdvantageBatch(torch.full((4,), 0.3), torch.zeros(4), mask)
    adv = compute_advantages("reinforce_pp", batch, beta=0.0)
    assert adv.abs().max() < 1e-6


def test_outcome_uses_the_episode_outcome():
    mask = torch.tensor([[1, 1], [1, 1]])
    batch = AdvantageBatch(torch.tensor([0.9, 0.1]), torch.tensor([0.0, 1.0]), mask)
    adv = compute_advantages("outcome", batch, beta=0.0)
    assert (adv[0] < 0).all() and (adv[1] > 0).all()  # the reverse of what the coach said
    assert torch.allclose(adv, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-6)


def test_grpo_group_baseline_by_hand():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    batch = AdvantageBatch(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.zeros(4), mask, group_ids=["a", "a", "b", "b"])
    adv = compute_advantages("grpo", batch, beta=0.0)
    # group a: rewards 1, 0 -> mean .5, unbiased std sqrt(.5) -> +-0.7071 on the last token; group b: equal -> 0.
    # Without KL the return-to-go is that value on every token; then whitening over the batch (as the reference).
    g = 0.5 / 0.5**0.5
    flat = whiten([g, g, -g, 0.0, 0.0, 0.0, 0.0, 0.0], [1, 1, 1, 0, 1, 1, 1, 1])
    assert torch.allclose(adv.flatten(), torch.tensor(flat), atol=1e-5)


def test_grpo_groups_of_one_get_no_baseline_and_are_counted():
    from baselines.algorithm.advantages import singleton_groups

    batch = AdvantageBatch(torch.tensor([1.0, 0.0]), torch.zeros(2), torch.ones(2, 2), group_ids=["a", "b"])
    adv = compute_advantages("grpo", batch, beta=0.0)
    assert torch.equal(adv, torch.zeros(2, 2))  # no group baseline: no reward signal (not a crash)
    assert singleton_groups(["a", "b", "c", "c"]) == 2


def test_grpo_has_the_same_kl_treatment_as_reinforce_pp():
    # with equal rewards in every group GRPO's reward part is 0: what is left is the KL term, which must be
    # exactly REINFORCE++'s (k1 in the reward, return-to-go, global whitening) on zero rewards
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    logp, ref = -torch.rand(4, 3), -torch.rand(4, 3)
    rewards = torch.tensor([0.3, 0.3, 0.8, 0.8])
    g = compute_advantages(
        "grpo", AdvantageBatch(rewards, torch.zeros(4), mask, logp, ref, ["a", "a", "b", "b"]), beta=0.1
    )
    r = compute_advantages("reinforce_pp", AdvantageBatch(torch.zeros(4), torch.zeros(4), mask, logp, ref), beta=0.1)
    assert g.abs().max() > 0.1 and torch.allclose(g, r, atol=1e-6)


def test_team_scope_normalises_over_every_role():
    from baselines.algorithm.advantages import RoleBatch, advantages_by_role

    def role(rewards, n_tokens):
        return RoleBatch(rewards, [0.0] * len(rewards), ["g"] * len(rewards), *([[torch.zeros(n_tokens)] * 2] * 2))

    batches = {"a": role([0.9, 0.7], 2), "b": role([0.1, 0.3], 2)}
    per_role = advantages_by_role("reinforce_pp", batches, scope="role", beta=0.0)
    team = advantages_by_role("reinforce_pp", batches, scope="team", beta=0.0)
    # per role, each role's best action gets +1; over the team, every action of role a beats every one of role b
    assert [float(v[0]) for v in per_role["a"]] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert [float(v[0]) for v in per_role["b"]] == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert all(v[0] > 0 for v in team["a"]) and all(v[0] < 0 for v in team["b"])
    assert [len(v) for v in team["a"]] == [2, 2]
    with pytest.raises(ValueError, match="scope"):
        advantages_by_role("reinforce_pp", batches, scope="world")


def test_kl_needs_log_probs_and_unknown_estimator():
    batch = AdvantageBatch(torch.tensor([1.0]), torch.tensor([1.0]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="needs logp"):
        compute_advantages("reinforce_pp", batch, beta=0.01)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("ppo-gae", batch)
    assert set(ESTIMATORS) == {"reinforce_pp", "grpo", "outcome"}


def test_responses_after_their_prompt_get_the_same_advantages():
    # the same two responses as above, placed after prompts of different lengths
    right_padded = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    after_prompt = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    rewards, outcomes = torch.tensor([0.7, 0.2]), torch.zeros(2)
    a = compute_advantages("reinforce_pp", AdvantageBatch(rewards, outcomes, right_padded), beta=0.0)
    b = compute_advantages("reinforce_pp", AdvantageBatch(rewards, outcomes, after_prompt), beta=0.0)
    assert torch.allclose(a[right_padded.bool()], b[after_prompt.bool()])


def test_token_logprobs_match_a_full_forward_pass():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from baselines.algorithm.samples import TokenBatch, token_logprobs

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=16,
        )
    ).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 5, 6, 7, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    resp = torch.tensor([[0, 0, 1, 1, 1.0], [0, 1, 1, 0, 0]])  # responses start after prompts of 3 and 2 tokens
    batch = TokenBatch(ids, attn, resp, 5, 5)
    with torch.no_grad():
        fast = token_logprobs(model, batch)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, :-1], -1)
        full = torch.gather(full, 2, ids[:, 1:, None]).squeeze(2)
    assert torch.allclose(fast[resp.bool()], full[resp.bool()], atol=1e-5)


def test_group_normalisation_uses_the_unbiased_std_as_the_reference():
    from baselines.algorithm.advantages import group_normalized

    out = group_normalized(torch.tensor([1.0, 0.0, 0.3, 0.9, 0.6, 0.5]), ["a", "a", "b", "b", "b", "c"])
    # a: std of (1, 0) with n - 1 = 0.7071 -> +-0.7071; b: mean .6, unbiased std .3 -> -1, 1, 0; c: alone -> 0
    assert out.tolist() == pytest.approx([0.70711, -0.70711, -1.0, 1.0, 0.0, 0.0], abs=1e-4)


def test_a_constant_reward_gives_no_advantage_from_the_kl_term_alone_unless_asked():
    """Every outcome 0 (or every group's rewards equal, for GRPO) while the policy has moved from its reference: the
    estimators' advantages would be the k1 KL term alone, whitened to unit scale. advantages_by_role gives 0 and
    names the role; ``kl_only=True`` gives the whitened KL term (what the trainers did before)."""
    from baselines.algorithm.advantages import RoleBatch, advantages_by_role, constant_signal

    def role(rewards, outcomes, groups):
        n = len(rewards)
        logp = [torch.tensor([-1.0, -2.0, -0.5]) * (i + 1) for i in range(n)]
        ref = [torch.tensor([-1.2, -1.5, -0.7]) for _ in range(n)]
        return RoleBatch(rewards, outcomes, groups, logp, ref)

    cases = {
        "outcome": role([0.2, 0.9, 0.4, 0.6], [0.0] * 4, ["t1"] * 4),
        "reinforce_pp": role([0.5] * 4, [1.0, 0.0, 1.0, 0.0], ["t1"] * 4),
        "grpo": role([0.2, 0.2, 0.8, 0.8], [0.0] * 4, ["t1", "t1", "t2", "t2"]),  # equal within each group
    }
    for name, batch in cases.items():
        flagged: set[str] = set()
        guarded = advantages_by_role(name, {"solver": batch}, beta=0.01, no_signal=flagged)["solver"]
        noise = advantages_by_role(name, {"solver": batch}, beta=0.01, kl_only=True)["solver"]
        assert flagged == {"solver"} and all(float(a.abs().max()) == 0.0 for a in guarded), name
        assert max(float(a.abs().max()) for a in noise) > 0.5, name  # unit-scale noise, from the KL term alone
    varied = role([0.2, 0.9, 0.4, 0.6], [0.0] * 4, ["t1", "t1", "t2", "t2"])
    flagged = set()
    adv = advantages_by_role("grpo", {"solver": varied}, beta=0.01, no_signal=flagged)["solver"]
    assert not flagged and max(float(a.abs().max()) for a in adv) > 0.5
    assert not constant_signal(
        "reinforce_pp", AdvantageBatch(torch.tensor([0.1, 0.2]), torch.zeros(2), torch.ones(2, 3))
    )
