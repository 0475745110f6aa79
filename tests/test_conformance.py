"""Every registered environment passes PettingZoo's own API and seed tests."""

import warnings

import pytest
from pettingzoo.test import api_test, seed_test

import mappa_envs

ENV_IDS = [spec.id for spec in mappa_envs.list_envs()]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_api(env_id):
    env = mappa_envs.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "observation is not a numpy array": text envs by design
        api_test(env, num_cycles=50)
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_seed(env_id):
    seed_test(lambda: mappa_envs.make(env_id), num_cycles=20)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spaces_built_once_and_independent(env_id):
    a, b = mappa_envs.make(env_id), mappa_envs.make(env_id)
    agent = a.possible_agents[0]
    assert a.observation_space(agent) is a.observation_space(agent)
    assert a.action_space(agent) is not b.action_space(agent)  # independent RNGs per env instance
    a.action_space(agent).seed(1)
    b.action_space(agent).seed(1)
    assert a.action_space(agent).sample() == b.action_space(agent).sample()
