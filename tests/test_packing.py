"""Prefix-shared packing (:mod:`baselines.packing`) computes exactly what padded rows compute: every sample's
response log-probs and the gradient of any weighted sum of them, with fewer positions; packs respect their token
budget; the trainer's plan keeps a pack's samples on one rank."""

from __future__ import annotations

import pytest
import torch

from baselines.config import TrainConfig
from baselines.distributed import plan_shards
from baselines.packing import build_pack, distinct_tokens, pack_samples, packed_logprobs
from baselines.samples import TokenBatch, token_logprobs

P = [5, 6, 7, 8, 9]  # a shared system prompt
ROWS = [
    ([*P, 10, 11, 12], 5),  # two samples of one prompt whose responses start alike (GRPO)
    ([*P, 10, 11, 13, 14], 5),
    ([*P, 10, 11, 12, 20, 21, 22], 8),  # the first one's second turn: its prompt holds the first turn whole
    ([1, 2, 3, 4], 2),  # nothing shared
    ([*P, 10, 40], 6),
]


def _model(impl: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg).float()


def _dense(model, ids: list[int], start: int, temperature: float):
    b = TokenBatch(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), torch.zeros(1, len(ids) - 1), 0, 0)
    b.response_mask[0, start - 1 :] = 1
    return token_logprobs(model, b, temperature)[0][b.response_mask[0].bool()]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_pack_gives_each_row_its_own_logprobs_and_gradient(impl):
    model = _model(impl)
    pack = build_pack(ROWS)
    assert pack.tokens == distinct_tokens(ROWS) == 18 < pack.dense_tokens == 39
    got = packed_logprobs(model, pack, 0.7)
    for (ids, start), lp in zip(ROWS, got, strict=True):
        assert lp.shape == (len(ids) - start,)
        torch.testing.assert_close(lp, _dense(model, ids, start, 0.7), atol=1e-5, rtol=1e-5)
    # the two GRPO samples' first two response tokens are one position each: one log-prob, used twice
    assert torch.equal(pack.sample_tokens[0][:2], pack.sample_tokens[1][:2])

    weights = [1.0, -2.0, 0.5, 3.0, -1.0]  # per-sample advantages of either sign
    model.zero_grad()
    sum(w * lp.sum() for w, lp in zip(weights, packed_logprobs(model, pack, 0.7), strict=True)).backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for w, (ids, start) in zip(weights, ROWS, strict=True):
        (w * _dense(model, ids, start, 0.7).sum()).backward()
    for a, b in zip(packed, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert max(float(g.abs().max()) for g in packed) > 1e-3  # a gradient that is there to compare


def test_packs_hold_their_budget_and_every_row_once():
    rows = ROWS * 3
    for budget in (1, 8, 12, 20, 1000):
        packs = pack_samples(rows, budget)
        assert sorted(i for p in packs for i in p) == list(range(len(rows)))
        for p in packs:
            n = distinct_tokens([rows[i] for i in p])
            pack = build_pack([rows[i] for i in p])
            # a row over the budget is a pack alone; half the budget at most is response tokens (logits)
            assert (n <= budget and len(pack.target_ids) <= budget // 2) or len(p) == 1
            assert pack.tokens == n
    assert len(pack_samples(rows, 1000)) == 1 and distinct_tokens(rows) == 18  # repeats cost nothing
    assert len(pack_samples(rows, 20)) == 2  # their 18 distinct tokens fit 20, their 11 response tokens not 10
    with pytest.raises(ValueError):
        pack_samples(rows, 0)
    with pytest.raises(ValueError, match="prompt and a response"):
        build_pack([([1, 2, 3], 3)])


def test_the_plan_keeps_a_packs_samples_on_one_rank():
    cfg = TrainConfig(pack_tokens=12, micro_batch=1)
    shards, n = plan_shards(ROWS, 2, cfg)
    assert sorted(i for sh in shards for i in sh) == list(range(len(ROWS)))
    for p in pack_samples(ROWS, 12):
        assert sum(any(i in sh for i in p) for sh in shards) == 1
    assert n == max(len(pack_samples([ROWS[i] for i in sh], 12)) for sh in shards)
    dense, n_dense = plan_shards(ROWS, 2, TrainConfig(micro_batch=1))
    assert n_dense == max(len(sh) for sh in dense) >= n
