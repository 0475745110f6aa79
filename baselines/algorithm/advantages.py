"""Advantage estimators: pure functions in one table (:data:`ESTIMATORS`); adding one touches one place, and a
package of your own adds one without editing this one (:func:`register_estimator`, entry points
:data:`PLUGIN_GROUP`; ``docs/training.md``).

Shapes: ``B`` samples (one per action), ``T`` token positions; ``mask`` marks each sample's response tokens (a
contiguous span anywhere in the row: right-padded responses, or responses after their prompt). Every estimator
takes an :class:`AdvantageBatch` and keyword options and returns advantages of shape ``[B, T]``, zero where
``mask`` is 0.

=================  ==========================================================================================
``reinforce_pp``   REINFORCE++ (the method's main baseline): token reward ``r_t = -beta * KL_t`` with the k1
                   estimate ``KL_t = logp_t - ref_logp_t``, plus the sample's reward (the coach's score / 10) on
                   its last response token; undiscounted return-to-go ``G_t = sum_{u >= t} r_u``; advantages are
                   the returns normalised by the mean and standard deviation over every valid token of the batch
                   (the global batch of one role, or of all roles if the caller batches them together).
``outcome``        the same estimator with the episode's outcome (success / metric) as the sample's reward
                   instead of the coach's score: the outcome-only baseline.
``grpo``           GRPO as the reference implementation runs it (ltjed/multiagent-coaching, MARTI's
                   ``marti/trainers/experience_maker.py``, estimator ``group_norm``, itself OpenRLHF's): each
                   sample's reward is normalised within its group, ``R'_i = (R_i - mean_g R) / (std_g R + 1e-9)``
                   with the *unbiased* standard deviation (``torch.std``'s default, as there); then the same
                   token rewards as REINFORCE++ (``-beta * KL_t``, k1, in the reward, not in the loss: the
                   reference runs with ``use_kl_loss=False``) with ``R'_i`` on the last token, undiscounted
                   return-to-go, and the same global whitening over the batch *after* grouping (as the reference
                   does). So the three estimators differ only in the reward each sample carries.
                   **Groups for multi-turn pipelines**: a group is every action of one agent in the samples of one
                   task (``Sample.group_id`` = ``task|agent``), all turns pooled. Keyed by turn (the first version
                   here) a code executor that took 2 turns in one sample and 1 in the other left its second turn
                   alone in a group; pooled, every agent that acts in each of a task's ``k >= 2`` samples has a
                   baseline of at least ``k`` actions. A group that still has one action (an agent that acted in
                   only one sample, or whose other actions were masked) gets no group baseline: its reward part
                   is 0 and :func:`singleton_groups` counts it (the trainers report ``grpo_singletons``).
                   ``samples_per_prompt < 2`` is refused when the trainer is built (``baselines.planning.checks``).
=================  ==========================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch


@dataclass
class AdvantageBatch:
    """The per-sample inputs of the estimators."""

    rewards: torch.Tensor
    """[B] process reward of each sample (coach score / 10)."""
    outcomes: torch.Tensor
    """[B] episode outcome of each sample's episode (1/0 success, or a quality in [0, 1])."""
    mask: torch.Tensor
    """[B, T] 1 for response tokens, 0 for padding."""
    logp: torch.Tensor | None = None
    """[B, T] log-probabilities of the response tokens under the policy that generated them."""
    ref_logp: torch.Tensor | None = None
    """[B, T] the same under the frozen reference model."""
    group_ids: list[str] | None = None
    """[B] prompt-group id of each sample (GRPO)."""


def _masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries, in float64: with (near) constant returns float32
    rounding alone would leave a std of ~1e-8 that, divided into, turns into advantages of order 1."""
    x64, m64 = x.double(), mask.double()
    n = m64.sum().clamp(min=1)
    mean = (x64 * m64).sum() / n
    var = (((x64 - mean) * m64) ** 2).sum() / n
    return ((x64 - mean) / (var.sqrt() + eps) * m64).to(x.dtype)


def token_rewards(sample_rewards: torch.Tensor, batch: AdvantageBatch, beta: float) -> torch.Tensor:
    """``-beta * KL_t`` on every response token plus the sample reward on its last token: ``[B, T]``."""
    mask = batch.mask.to(torch.float32)
    r = torch.zeros_like(mask)
    if beta:
        if batch.logp is None or batch.ref_logp is None:
            raise ValueError("a KL penalty (beta > 0) needs logp and ref_logp")
        r = r - beta * (batch.logp - batch.ref_logp) * mask
    if (mask.sum(dim=1) == 0).any():
        raise ValueError("a sample has no response token: it cannot carry a reward")
    positions = torch.arange(mask.shape[1], dtype=torch.float32)
    last = (mask * (positions + 1)).argmax(dim=1)  # the last response token, wherever the response sits
    rows = torch.arange(mask.shape[0])
    r[rows, last] += sample_rewards.to(torch.float32)
    return r


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{u >= t} r_u`` (gamma = 1) within each sample: a reversed cumulative sum, ``[B, T]``."""
    return torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1]) * mask


def reinforce_pp(batch: AdvantageBatch, *, beta: float = 0.01, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with the process (coach) reward. See the module docstring."""
    mask = batch.mask.to(torch.float32)
    returns = returns_to_go(token_rewards(batch.rewards, batch, beta), mask)
    return _masked_whiten(returns, mask, eps)


def outcome(batch: AdvantageBatch, *, beta: float = 0.01, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with the episode outcome as the only (terminal) reward."""
    mask = batch.mask.to(torch.float32)
    returns = returns_to_go(token_rewards(batch.outcomes, batch, beta), mask)
    return _masked_whiten(returns, mask, eps)


def groups_of(group_ids: list[str]) -> dict[str, list[int]]:
    """Sample indices by group id, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def singleton_groups(group_ids: list[str]) -> int:
    """How many samples are alone in their GRPO group (they get no group baseline)."""
    return sum(len(idx) == 1 for idx in groups_of(group_ids).values())


def group_normalized(rewards: torch.Tensor, group_ids: list[str], eps: float = 1e-9) -> torch.Tensor:
    """``(R_i - mean_g R) / (std_g R + eps)`` per group (unbiased std, as the reference); 0 for a group of one."""
    rewards = rewards.to(torch.float64)
    out = torch.zeros_like(rewards)
    for idx in groups_of(group_ids).values():
        if len(idx) < 2:
            continue
        r = rewards[idx]
        out[idx] = (r - r.mean()) / (r.std() + eps)
    return out.to(torch.float32)


def grpo(batch: AdvantageBatch, *, beta: float = 0.01, eps: float = 1e-6, use_outcome: bool = False) -> torch.Tensor:
    """GRPO (the reference's ``group_norm``): group-normalised rewards, then REINFORCE++'s KL, returns and global
    whitening. See the module docstring."""
    if batch.group_ids is None:
        raise ValueError("GRPO needs group_ids: which samples share a task")
    if len(batch.group_ids) != batch.mask.shape[0]:
        raise ValueError(f"{len(batch.group_ids)} group ids for {batch.mask.shape[0]} samples")
    rewards = batch.outcomes if use_outcome else batch.rewards
    mask = batch.mask.to(torch.float32)
    returns = returns_to_go(token_rewards(group_normalized(rewards, batch.group_ids), batch, beta), mask)
    return _masked_whiten(returns, mask, eps)


Estimator = Callable[..., torch.Tensor]
"""``fn(batch: AdvantageBatch, *, beta: float, **options) -> [B, T] advantages`` (zero where ``mask`` is 0)."""
Signal = Callable[..., torch.Tensor]
"""``signal(batch: AdvantageBatch, **options) -> [B]``: the reward an estimator puts on each sample's last token
before the KL term and the whitening (the coach's score, the outcome, a group-normalised reward)."""


def process_signal(batch: AdvantageBatch, **_: object) -> torch.Tensor:
    return batch.rewards


def outcome_signal(batch: AdvantageBatch, **_: object) -> torch.Tensor:
    return batch.outcomes


def grpo_signal(batch: AdvantageBatch, *, use_outcome: bool = False, **_: object) -> torch.Tensor:
    if batch.group_ids is None:
        raise ValueError("GRPO needs group_ids: which samples share a task")
    return group_normalized(batch.outcomes if use_outcome else batch.rewards, batch.group_ids)


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator and what the trainers must know of it."""

    fn: Estimator
    process_reward: bool = True
    """It trains on the coach's per-action reward (False: only on the episode's outcome, as ``outcome``): coach
    fallbacks are then masked out of its loss."""
    min_samples_per_prompt: int = 1
    """Samples of each task per iteration its baseline needs (GRPO: 2); fewer is refused by the checks, and its
    groups of one are counted (``grpo_singletons``)."""
    signal: Signal | None = None
    """The reward it puts on each sample (:data:`Signal`); where that is the same for every sample of a batch, the
    batch's advantages would be the whitened KL term alone, and the trainers take no step on it
    (:func:`constant_signal`; ``--kl-only-updates`` takes it). None: the estimator's signal is unknown, always
    stepped on."""


ESTIMATORS: dict[str, Estimator] = {}
"""Every registered estimator by name (the built-ins, then plug-ins: :func:`register_estimator`)."""
_SPECS: dict[str, EstimatorSpec] = {}
PLUGIN_GROUP = "mappa_envs.estimators"
"""The entry-point group of estimator plug-ins: each entry names a function that calls :func:`register_estimator`
(as a task's entry point calls ``mappa_envs.register``)."""
_plugins_loaded = False


def register_estimator(
    name: str,
    fn: Estimator,
    *,
    process_reward: bool = True,
    min_samples_per_prompt: int = 1,
    signal: Signal | None = None,
    override: bool = False,
) -> Estimator:
    """Make ``fn`` available as ``mappa train --estimator NAME`` (and to ``mappa ablate --arms``); ``signal``:
    :attr:`EstimatorSpec.signal`."""
    if name in _SPECS and not override and _SPECS[name].fn is not fn:
        raise ValueError(f"an estimator is already registered as {name!r} (override=True replaces it)")
    _SPECS[name] = EstimatorSpec(fn, process_reward, min_samples_per_prompt, signal)
    ESTIMATORS[name] = fn
    return fn


def load_estimator_plugins() -> None:
    """Call every installed package's estimator entry point (group :data:`PLUGIN_GROUP`) once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True

    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()()


def estimator_spec(name: str) -> EstimatorSpec:
    """The registered estimator ``name`` (plug-ins loaded first); ValueError naming the choices."""
    if name not in _SPECS:
        load_estimator_plugins()
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(_SPECS)}") from None


register_estimator("reinforce_pp", reinforce_pp, signal=process_signal)
register_estimator("grpo", grpo, min_samples_per_prompt=2, signal=grpo_signal)
register_estimator("outcome", outcome, process_reward=False, signal=outcome_signal)


def uses_process_reward(name: str) -> bool:
    """Whether the estimator trains on the coach's (process) reward, so that coach fallbacks matter to it."""
    return estimator_spec(name).process_reward


def compute_advantages(name: str, batch: AdvantageBatch, **options: object) -> torch.Tensor:
    return estimator_spec(name).fn(batch, **options)


def constant_signal(name: str, batch: AdvantageBatch, **options: object) -> bool:
    """Whether the estimator's reward (:attr:`EstimatorSpec.signal`) is the same for every sample of ``batch``
    (for GRPO: every group's rewards are equal, so each normalised reward is 0). Its advantages are then the KL
    term alone, whitened to unit scale: noise the size of a real signal. False for an estimator without a
    ``signal``.

    >>> b = AdvantageBatch(rewards=torch.tensor([0.3, 0.7]), outcomes=torch.zeros(2), mask=torch.ones(2, 3))
    >>> constant_signal("outcome", b), constant_signal("reinforce_pp", b)
    (True, False)
    """
    signal = estimator_spec(name).signal
    if signal is None:
        return False
    values = signal(batch, **options).to(torch.float64)
    return values.numel() == 0 or float(values.max() - values.min()) <= 1e-9


@dataclass
class RoleBatch:
    """One role's samples as the trainers hold them: per-sample response log-probs of different lengths."""

    rewards: list[float]
    outcomes: list[float]
    group_ids: list[str]
    logp: list[torch.Tensor]
    """[n_i] per sample: log-probs of its response tokens under the generating policy."""
    ref_logp: list[torch.Tensor]
    """[n_i] the same under the frozen reference."""

    @classmethod
    def concat(cls, batches: list[RoleBatch]) -> RoleBatch:
        """Several roles' batches as one (roles that share weights: one step on all their samples)."""
        return cls(*([x for b in batches for x in getattr(b, f)] for f in cls.__dataclass_fields__))


def _left_aligned(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r.to(torch.float32)
    return out


def advantages_by_role(
    name: str,
    batches: dict[str, RoleBatch],
    *,
    scope: str = "role",
    kl_only: bool = False,
    no_signal: set[str] | None = None,
    **options: object,
):
    """Per role, one advantage vector per sample (the length of its response), from the role's whole batch
    (``scope='role'``, the reference: each agent trained separately) or from every role's samples together
    (``scope='team'``, docs/method.md's option: one normalisation over the team).

    A batch whose reward is constant (:func:`constant_signal`) has its roles added to ``no_signal`` (when given),
    and its advantages are 0, so no step is taken on the KL term alone; ``kl_only=True`` computes them anyway
    (``TrainConfig.kl_only_updates``, ``--kl-only-updates``)."""
    if scope not in ("role", "team"):
        raise ValueError(f"advantage scope must be 'role' or 'team', not {scope!r}")
    groups = [[r] for r in batches] if scope == "role" else [list(batches)]
    out: dict[str, list[torch.Tensor]] = {}
    for roles in groups:
        logp = [x for r in roles for x in batches[r].logp]
        if not logp:
            out.update({r: [] for r in roles})
            continue
        width = max(len(x) for x in logp)
        lengths = torch.tensor([len(x) for x in logp])
        mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float32)
        batch = AdvantageBatch(
            rewards=torch.tensor([x for r in roles for x in batches[r].rewards], dtype=torch.float32),
            outcomes=torch.tensor([x for r in roles for x in batches[r].outcomes], dtype=torch.float32),
            mask=mask,
            logp=_left_aligned(logp, width),
            ref_logp=_left_aligned([x for r in roles for x in batches[r].ref_logp], width),
            group_ids=[x for r in roles for x in batches[r].group_ids],
        )
        flat = constant_signal(name, batch, **options)
        if flat and no_signal is not None:
            no_signal.update(r for r in roles if batches[r].logp)
        adv = torch.zeros_like(mask) if flat and not kl_only else compute_advantages(name, batch, **options)
        row = 0
        for r in roles:
            n = len(batches[r].logp)
            out[r] = [adv[row + i, : len(batches[r].logp[i])].clone() for i in range(n)]
            row += n
    return out
