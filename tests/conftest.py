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


REAL_CONTAINER = ("docker", "bubblewrap")


def pytest_collection_modifyitems(config, items):
    """Tests that start real containers (a Docker or bubblewrap sandbox: the marker ``docker``, or a parameter id
    naming the backend) are ``slow``: ``make test-fast`` leaves them to ``make test``."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        ids = callspec.id.split("-") if callspec is not None else []
        if item.get_closest_marker("docker") or any(backend in ids for backend in REAL_CONTAINER):
            item.add_marker(pytest.mark.slow)
