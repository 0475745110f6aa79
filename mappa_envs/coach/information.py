"""What a reward sees: every coach declares its information, and every run, result file and report shows it.

A process reward that reads an answer key for every agent's action and an outcome-only reward are trained on
different label information; a comparison between them is not "process versus outcome". So each coach has an
``information`` attribute, a tuple of these labels (:data:`LABELS`), and :func:`information_label` gives the string
stored in a run's ``config.json`` (``reward_information``), in result files and shown in reports and leaderboards.

=========================  =====================================================================================
label                      the reward sees
=========================  =====================================================================================
``none``                   neither an answer key nor the outcome (e.g. :class:`~mappa_envs.coach.LengthCoach`)
``outcome``                how the episode ended, once it is over: whether it succeeded and, for a graded task,
                           the figures of its scoring (DSBench: validity, the scorer's reason and stage, quality)
                           (outcome-only training; a hindsight coach's blame)
``final-answer-key``       the ground truth when scoring the final agent's answer, nothing of it for earlier
                           agents: what the method's LLM coach sees (``docs/method.md``)
``per-action-answer-key``  the ground truth when scoring any agent's action (e.g. a code executor's printout
                           checked against the answer): an answer-key coach, a method of its own
=========================  =====================================================================================

A coach without the attribute (a plug-in that does not declare) is labelled ``undeclared``.
"""

from __future__ import annotations

from typing import Any

LABELS = {
    "none": "neither an answer key nor the outcome",
    "outcome": "whether the episode succeeded, once it is over",
    "final-answer-key": "the ground truth when scoring the final agent's answer only",
    "per-action-answer-key": "the ground truth when scoring any agent's action",
}
_ORDER = tuple(LABELS)


def information_label(information: Any) -> str:
    """``("outcome", "per-action-answer-key")`` -> ``"outcome+per-action-answer-key"`` (labels in :data:`LABELS`
    order); a coach object is asked for its ``information``; None -> ``"undeclared"``."""
    if information is not None and not isinstance(information, (tuple, list, set, frozenset, str)):
        information = getattr(information, "information", None)
    if information is None:
        return "undeclared"
    labels = {information} if isinstance(information, str) else set(information)
    unknown = labels - set(LABELS)
    if unknown:
        raise ValueError(f"unknown information labels {sorted(unknown)}; known: {list(LABELS)}")
    if len(labels) > 1:
        labels.discard("none")
    return "+".join(label for label in _ORDER if label in labels)


def reward_information(coach: Any, process_reward: bool = True) -> str:
    """The label of a training run's reward: ``outcome`` for an estimator that trains on the outcome only
    (``process_reward=False``) or without a coach (``None`` or ``"none"``), else its coach's (a coach object; build
    one from a spec with :func:`~mappa_envs.coach.coach_from_spec`)."""
    if coach is None or coach == "none" or not process_reward:
        return "outcome"
    return information_label(coach)


__all__ = ["LABELS", "information_label", "reward_information"]
