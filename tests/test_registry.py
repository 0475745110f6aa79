import pytest

import mappa_envs
from mappa_envs.tasks.mathchat import MathChatEnv


def test_make_and_spec():
    env = mappa_envs.make("mappa/MathChat-v0", split="amc-eval-32")
    assert isinstance(env, MathChatEnv)
    assert env.spec.id == "mappa/MathChat-v0"
    assert len(env.tasks) == 32


def test_unknown_id_is_a_clear_error():
    with pytest.raises(KeyError, match="no environment registered"):
        mappa_envs.make("mappa/NoSuchEnv-v0")


def test_register_duplicate_and_invalid():
    with pytest.raises(ValueError, match="already registered"):
        mappa_envs.register("mappa/MathChat-v0", "mappa_envs.tasks.mathchat:MathChatEnv")
    with pytest.raises(ValueError, match="invalid env id"):
        mappa_envs.register("no version", "x:y")


def test_register_with_default_kwargs():
    mappa_envs.register(
        "test/MathChatAMC-v0",
        "mappa_envs.tasks.mathchat:MathChatEnv",
        kwargs={"split": "amc-eval-32"},
        override=True,
    )
    try:
        env = mappa_envs.make("test/MathChatAMC-v0")
        assert env.split == "amc-eval-32"
        assert "test/MathChatAMC-v0" in [s.id for s in mappa_envs.list_envs()]
    finally:
        mappa_envs.registry.pop("test/MathChatAMC-v0")
