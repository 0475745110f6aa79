"""Prefix-shared packing (:mod:`baselines.ray_learner.packing`) computes exactly what padded rows compute: every
sample's response log-probs and the gradient of any weighted sum of them, with fewer positions; packs respect their
token budget; the trainer's plan keeps a pack's samples on one rank."""

from __future__ import annotations

import pytest
import torch

from baselines.algorithm.samples import TokenBatch, token_logprobs
from baselines.config import TrainConfig
from baselines.ray_learner.distributed import plan_shards
from baselines.ray_learner.packing import (
    build_pack,
    distinct_tokens,
    pack_samples,
    packed_logprobs,
    plan_packs,
    prefix_states,
    shared_prefix,
    strip_prefix,
)

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


@pytest.mark.parametrize("share", [False, True])
def test_the_plan_keeps_a_packs_samples_on_one_rank(share):
    cfg = TrainConfig(pack_tokens=12, micro_batch=1, share_prefix=share)
    shards, n = plan_shards(ROWS, 2, cfg)
    assert sorted(i for sh in shards for i in sh) == list(range(len(ROWS)))
    for p in plan_packs(ROWS, 12, share)[1]:
        assert sum(any(i in sh for i in p) for sh in shards) == 1
    assert n == max(len(plan_packs([ROWS[i] for i in sh], 12, share)[1]) for sh in shards)
    dense, n_dense = plan_shards(ROWS, 2, TrainConfig(micro_batch=1))
    assert n_dense == max(len(sh) for sh in dense) >= n


SHARED = [(r[0], r[1]) for r in ROWS if r[0][:5] == P]  # the rows that start with the system prompt


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_prefix_run_once_for_several_packs_gives_the_same_logprobs_and_gradient(impl, checkpointing):
    """Under gradient checkpointing too: the packs' layers recompute in the backward pass, reading the same prefix
    keys and values (a cache that stores nothing), and the prefix's own pass keeps its keys and values."""
    model = _model(impl)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    n = shared_prefix(SHARED, cap=100)
    assert n == 4  # the system prompt less its last token: a 5-token prompt's last token is a response's parent
    assert shared_prefix(SHARED, cap=3) == 3 and shared_prefix(ROWS, cap=100) == 0  # [1, 2, 3, 4] shares nothing
    assert shared_prefix([([*P, 10, 11], 2)], cap=100) == 1  # short of the first response token's parent
    rows = strip_prefix(SHARED, n)
    packs = [[0, 1], [2, 3]]  # two packs, both attending to the one prefix
    weights = [1.0, -2.0, 0.5, -1.0]

    calls = []  # a decoder layer's forward runs: with checkpointing, once more in the backward pass of a pack
    model.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    model.zero_grad()
    prefix = prefix_states(model, SHARED[0][0][:n])
    assert len(calls) == 1
    for p in packs:
        calls.clear()
        lps = packed_logprobs(model, build_pack([rows[i] for i in p]), 0.7, prefix=prefix)
        for i, lp in zip(p, lps, strict=True):
            ids, start = SHARED[i]
            assert lp.shape == (len(ids) - start,)
            torch.testing.assert_close(lp.detach(), _dense(model, ids, start, 0.7).detach(), atol=1e-5, rtol=1e-5)
        loss = sum(weights[i] * lp.sum() for i, lp in zip(p, lps, strict=True))
        calls.clear()
        loss.backward()  # one backward per pack, as the trainer's micro-batches
        assert len(calls) == int(checkpointing)  # the pack was checkpointed (and recomputed), the prefix never
    for layer in model.model.layers:  # the passes left the model's settings as they found them
        assert layer.gradient_checkpointing == checkpointing and "_can_checkpoint_with_cache" not in vars(layer)
    before = [p.grad.clone() for p in model.parameters()]
    prefix.backward_loss().backward()  # the packs' gradients at the prefix, through its forward, once
    shared = [p.grad.clone() for p in model.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(before, shared, strict=True)) > 1e-4  # it adds something

    model.zero_grad()
    for w, (ids, start) in zip(weights, SHARED, strict=True):
        (w * _dense(model, ids, start, 0.7).sum()).backward()
    for a, b in zip(shared, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_plan_packs_the_rows_without_their_shared_prefix():
    n, packs = plan_packs(SHARED, 12, share=True)
    assert n == 4 and packs == pack_samples(strip_prefix(SHARED, 4), 12)
    assert plan_packs(SHARED, 12, share=False) == (0, pack_samples(SHARED, 12))
    assert plan_packs([], 12, share=True) == (0, [])
    # two packs either way; the prefix's 4 positions are computed once instead of once per pack
    rows = strip_prefix(SHARED, n)
    once = n + sum(distinct_tokens([rows[i] for i in p]) for p in packs)
    per_pack = sum(distinct_tokens([SHARED[i] for i in p]) for p in pack_samples(SHARED, 12))
    assert len(packs) == 2 and once == per_pack - 4


def test_models_whose_attention_a_pack_cannot_stand_for_are_named():
    """A pack's mask is full attention over a token's ancestors: a sliding window shorter than the longest row, a
    layer of another kind, or a model without attention is named (and a window longer than any row is fine)."""
    from transformers import Gemma3TextConfig, LlamaConfig, MambaConfig, MistralConfig, PretrainedConfig, Qwen2Config

    from baselines.weights.shapes import check_packable, packing_problem

    assert packing_problem(LlamaConfig(), 800) is None
    assert packing_problem(Qwen2Config(), 800) is None  # its window is off (use_sliding_window false)
    assert packing_problem(MistralConfig(sliding_window=4096), 800) is None
    assert "sliding window (64 tokens)" in packing_problem(MistralConfig(sliding_window=64), 800)
    qwen = Qwen2Config(use_sliding_window=True, sliding_window=128, max_window_layers=1, num_hidden_layers=4)
    assert "sliding-window layers (128 tokens)" in packing_problem(qwen, 800)
    assert packing_problem(Gemma3TextConfig(sliding_window=4096), 800) is None
    assert "sliding-window layers (512 tokens)" in packing_problem(Gemma3TextConfig(sliding_window=512), 800)
    hybrid = LlamaConfig()
    hybrid.layer_types = ["full_attention", "linear_attention"]
    assert "linear_attention layers" in packing_problem(hybrid, 800)
    assert "linear_attention layers" in packing_problem(MambaConfig(), 800)  # how transformers names its layers
    assert "not an attention-only model" in packing_problem(PretrainedConfig(), 800)  # nothing says attention

    cfg = TrainConfig(pack_tokens=512, max_prompt_tokens=768, max_new_tokens=32)
    check_packable(cfg, {"llama": LlamaConfig()})
    with pytest.raises(
        ValueError,
        match=r"m2: MistralConfig attends through a sliding window \(64 tokens\) and rows "
        r"of up to 801 tokens\): set pack_tokens to 0",
    ):
        check_packable(cfg, {"llama": LlamaConfig(), "m2": MistralConfig(sliding_window=64)})
    check_packable(TrainConfig(pack_tokens=0), {"m2": MistralConfig(sliding_window=64)})  # padded rows: exact


def test_the_ray_trainer_refuses_a_sliding_window_model_with_packs_before_ray_starts(tmp_path):
    """A role on its own model (``full@DIR``) whose window is shorter than a row: refused when the trainer is made,
    naming the model, with no Ray cluster started."""
    import shutil

    import ray
    from transformers import MistralConfig

    from baselines.training.ray_trainer import RayTrainer
    from baselines.weights.models import tiny_model_dir

    other = tmp_path / "mistral"
    shutil.copytree(tiny_model_dir(), other)
    (other / "model.safetensors").unlink(missing_ok=True)  # the config is all the check reads
    MistralConfig(sliding_window=64).save_pretrained(other)
    cfg = TrainConfig(
        model="tiny-random",
        pack_tokens=512,
        role_weights={"verifier": f"full@{other}"},
        memory_check=False,
        out_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ValueError, match=rf"{other}: MistralConfig attends through a sliding window \(64 tokens\)"):
        RayTrainer(cfg)
    assert not ray.is_initialized()
