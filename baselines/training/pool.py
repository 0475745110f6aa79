"""Warm actors shared by the runs of one process: a run of the distributed trainer takes its vLLM engines and DeepSpeed
ranks from an :class:`ActorPool` instead of starting them, resets them, and gives them back when it closes; the next
run (an ablation's next arm or seed, a test suite's next test) starts in seconds instead of paying the processes'
start-up, the libraries' imports and the engines' warm-up again.

An actor is reused only by a run that would have started the same actor: the pool is keyed by :class:`ActorKey`
(what the actor was started with and cannot change afterwards: the model, the dtype, the device, an engine's context
length and cache, a set of ranks' world size, ZeRO stage and LoRA adapters, the custom resource it was placed by).
Everything a run may change (the learning rate, the estimator, the seed, the batch plan...) reaches the actor at the
reset. A reset (:data:`~baselines.ray_learner.engines.RESET_STEPS`) makes a reused actor as a fresh one:

- ``weights``: an engine reads its model again from disk and drops its LoRA adapters; a rank builds its model
  again from the starting model (a LoRA rank: the base and new adapters);
- ``optimizer``: a rank's DeepSpeed engine and optimiser are rebuilt (Adam's moments gone, step count 0);
- ``rng``: every generator seeded from the run's seed (an engine's from the seed a fresh engine of that role gets);

and every engine's prefix cache is cleared. Every run resets its engines, fresh ones included (vLLM's warm-up draws
from the generator a run then samples from), so the same seed gives the same episodes cold or warm:
``tests/test_actor_pool.py`` runs a seed on fresh actors and again on reused ones and compares the first iteration's
episodes and update, and shows each reset step is needed.

>>> pool = ActorPool()
>>> key = ActorKey("engine", "/models/m", "float32", "cpu", (1024, 1.0, 0.25, ()), ())
>>> pool.take(key) is None
True
>>> pool.give(key, "an engine"); pool.take(key), pool.take(key)
('an engine', None)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baselines.ray_learner.engines import RESET_STEPS


@dataclass(frozen=True)
class ActorKey:
    """What an actor was started with and keeps for its life: two runs whose actors have the same key can share them."""

    kind: str
    """``engine``, ``ranks`` (a role's DeepSpeed ranks, as one group: they have met at their rendezvous) or
    ``lora-ranks``."""
    model: str
    """The model folder it was started on (what a reset reads again)."""
    dtype: str
    device: str
    shape: tuple
    """An engine's (context length, KV cache GB, GPU memory fraction, LoRA ranks); ranks' (world size, ZeRO stage,
    LoRA ranks)."""
    resources: tuple
    """The custom resource it was placed by (``--place``), as sorted items."""


@dataclass
class RunStart:
    """How one run got its actors."""

    out_dir: str
    seconds: float
    """From the trainer's start until its actors were ready and reset."""
    reused: int
    """Actors (an engine, or one set of ranks) taken from the pool."""
    started: int
    """Actors started for this run."""


@dataclass
class ActorPool:
    """Idle actors by :class:`ActorKey`. Pass one to every :class:`~baselines.training.ray_trainer.RayTrainer` of a
    process (``RayTrainer(cfg, pool=pool)``; ``mappa ablate`` does for its arms and seeds); close it (or use it as a
    context manager) to stop the actors. A run stops the idle actors it does not take before it starts new ones, so
    two runs' actors never hold memory at once."""

    reset_steps: tuple[str, ...] = RESET_STEPS
    """What a reset does; the pool's test leaves a step out to show the runs then differ. Keep the default."""
    starts: list[RunStart] = field(default_factory=list)
    """Each run's start-up, in order."""
    dropped: list[str] = field(default_factory=list)
    """Why each pooled actor found dead when a run took it was dropped (:meth:`alive`)."""
    _idle: dict[ActorKey, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.reset_steps) - set(RESET_STEPS)
        if unknown:
            raise ValueError(f"reset steps {sorted(unknown)}: expected some of {RESET_STEPS}")

    def take(self, key: ActorKey) -> Any | None:
        """An idle actor (an engine, or a list of ranks) with this key, or None."""
        idle = self._idle.get(key)
        return idle.pop() if idle else None

    def give(self, key: ActorKey, item: Any) -> None:
        """Hand an actor back at the end of a run (the next run that takes it resets it)."""
        self._idle.setdefault(key, []).append(item)

    def idle(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def _actors(self) -> Iterator[Any]:
        for items in self._idle.values():
            for item in items:
                yield from item if isinstance(item, list) else [item]

    def held_gib(self) -> float:
        """The memory (proportional set size, GiB) the idle actors' processes hold on this machine: what a run that
        takes or stops them has for itself (its memory check counts it as available). 0 without idle actors."""
        actors = list(self._actors())
        if not actors:
            return 0.0
        import ray

        pids = []
        for ref in [a.pid.remote() for a in actors]:  # asked all at once, read one by one
            try:
                pids.append(ray.get(ref, timeout=60))
            except Exception:  # a dead idle actor holds nothing; the run that takes its key drops it (alive())
                continue
        return sum(_pss_kib(pid) for pid in pids) / 1024**2

    def alive(self, ray: Any, item: Any, timeout_s: float = 60.0) -> bool:
        """Whether every process of ``item`` (an engine, or a list of ranks) answers; one that died while idle (a
        crash, the memory monitor, a killed process) is stopped, with the rest of its set, counted in ``dropped``
        and left out, so the run starts it again instead of failing at its reset."""
        actors = item if isinstance(item, list) else [item]
        try:
            ray.get([a.pid.remote() for a in actors], timeout=timeout_s)
            return True
        except Exception as err:  # RayActorError, ActorDiedError, GetTimeoutError: dead or hung
            for actor in actors:
                try:
                    ray.kill(actor)
                except Exception:  # already gone
                    pass
            self.dropped.append(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            return False

    def stop_idle(self, ray: Any) -> int:
        """Kill every idle actor; returns how many processes were stopped."""
        actors = list(self._actors())
        for actor in actors:
            ray.kill(actor)
        self._idle.clear()
        return len(actors)

    def close(self) -> None:
        if self._idle:
            import ray

            self.stop_idle(ray)

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pss_kib(pid: int) -> int:
    """A process's proportional set size (kB, Linux's ``smaps_rollup``); 0 where it cannot be read (another node, not
    Linux)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


__all__ = ["ActorKey", "ActorPool", "RunStart"]
