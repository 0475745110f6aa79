import os

import pytest

# Tests never reach model hubs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def mathchat():
    import mappa_envs

    env = mappa_envs.make("mappa/MathChat-v0", split="amc-eval-32")
    yield env
    env.close()
