"""Which weights each role acts and learns with: ``TrainConfig.role_weights`` maps a role to a spec (``mappa train
--role-weights ROLE=SPEC``, repeatable); a role not named has its own full model.

- ``full``: its own full model, trained on its own samples (the default);
- ``frozen``: acts with the base model and is never updated; its samples are not trained on (its coach scores are
  still logged); the distributed trainer starts its engine and no DeepSpeed rank;
- ``shared:ROLE``: the same trainable weights as ``ROLE`` (itself ``full`` or ``lora``): one optimiser step per
  iteration on both roles' samples, each role's advantages normalised over its own samples as before (both
  trainers; on the distributed one the roles also share one vLLM engine and one set of DeepSpeed ranks);
- ``lora[:RANK]``: its own LoRA adapter on one frozen base shared by every LoRA role (:mod:`baselines.weights.lora`; on
  the distributed trainer the LoRA roles also share one vLLM engine, which serves each adapter per request, and
  one set of ranks, :mod:`baselines.ray_learner.lora_worker`);
- ``full@MODEL``: its own full model, started from ``MODEL`` (a bundled key, a folder or a cached Hugging Face id)
  instead of the team's ``model``; its tokenizer is its own (a role sharing its weights acts with it too). The
  memory check sizes every role by the team's model.

>>> parse_spec("shared:problem_solver")
WeightSpec(kind='shared', of='problem_solver', rank=None, model=None)
>>> parse_spec("lora:16").rank
16
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("full", "frozen", "shared", "lora")

SPEC_FORMS: dict[str, str] = {
    "full": "its own full model, trained on its own samples (the default)",
    "full@MODEL": "its own full model started from MODEL (a bundled key, a folder or a cached Hugging Face id)",
    "frozen": "the base model, never updated; its samples are not trained on",
    "shared:ROLE": "the same trainable weights as ROLE (a full or lora role)",
    "lora[:RANK]": "its own LoRA adapter on one frozen base shared by every LoRA role",
}
"""Every form :func:`parse_spec` takes, with what it means (both trainers take each): the ``--role-weights`` help."""


def spec_forms_help() -> str:
    """The forms as one help sentence."""
    return "; ".join(f"{form}: {what}" for form, what in SPEC_FORMS.items())


@dataclass(frozen=True)
class WeightSpec:
    kind: str
    of: str | None = None
    """``shared``: the role whose weights it trains."""
    rank: int | None = None
    """``lora``: the adapter's rank (None: the default)."""
    model: str | None = None
    """``full@MODEL``: the role's own base model."""


def parse_spec(text: str) -> WeightSpec:
    """``full``, ``full@MODEL``, ``frozen``, ``shared:ROLE`` or ``lora[:RANK]``; ValueError on anything else."""
    head, _, model = text.strip().partition("@")
    kind, _, arg = head.partition(":")
    if kind == "full" and not arg:
        return WeightSpec("full", model=model or None)
    if model:
        raise ValueError(f"role weights {text!r}: only 'full' takes a model (full@MODEL)")
    if kind == "frozen" and not arg:
        return WeightSpec("frozen")
    if kind == "shared" and arg:
        return WeightSpec("shared", of=arg)
    if kind == "lora" and (not arg or arg.isdigit()):
        return WeightSpec("lora", rank=int(arg) if arg else None)
    raise ValueError(f"role weights {text!r}: expected full, full@MODEL, frozen, shared:ROLE or lora[:RANK]")


def spec_problems(role_weights: Mapping[str, str], roles: Sequence[str], trainer: str) -> list[str]:
    """Why ``role_weights`` cannot run with these roles and trainer (empty: it can)."""
    problems = [
        f"role_weights names {r!r}, not a role of the task ({list(roles)})" for r in role_weights if r not in roles
    ]
    specs: dict[str, WeightSpec] = {}
    for role, text in role_weights.items():
        try:
            specs[role] = parse_spec(text)
        except ValueError as e:
            problems.append(str(e))
    for role, s in specs.items():
        if s.kind == "shared":
            owner = specs.get(s.of or "", WeightSpec("full")) if s.of in roles else None
            if owner is None or s.of == role:
                problems.append(f"{role}=shared:{s.of}: share the weights of another role of the task ({list(roles)})")
            elif owner.kind not in ("full", "lora"):
                problems.append(
                    f"{role}=shared:{s.of}: {s.of} is {owner.kind}; share the weights of a 'full' or 'lora' role"
                )
    return problems


def role_specs(role_weights: Mapping[str, str], roles: Sequence[str], trainer: str) -> dict[str, WeightSpec]:
    """Every role's :class:`WeightSpec` (``full`` where not named); ValueError listing every problem."""
    problems = spec_problems(role_weights, roles, trainer)
    if problems:
        raise ValueError("role_weights: " + "; ".join(problems))
    return {role: parse_spec(role_weights[role]) if role in role_weights else WeightSpec("full") for role in roles}


def effective_role_weights(cfg: Any, roles: Sequence[str]) -> dict[str, str]:
    """A :class:`~baselines.config.TrainConfig`'s ``role_weights``, with ``share_model`` (every role on the first
    role's weights) spelled out as ``shared:`` specs for the roles not named."""
    out = dict(cfg.role_weights)
    if cfg.share_model and roles:
        for role in roles[1:]:
            out.setdefault(role, f"shared:{roles[0]}")
    return out


def owners(specs: Mapping[str, WeightSpec]) -> dict[str, str]:
    """Whose weights each role acts with: a ``shared`` role its owner's, every other role its own."""
    return {r: (s.of or r) if s.kind == "shared" else r for r, s in specs.items()}


def role_models(specs: Mapping[str, WeightSpec], default: str) -> dict[str, str]:
    """Each role's base model: its own (``full@MODEL``), its owner's for a ``shared`` role, else ``default``.

    >>> role_models({"a": parse_spec("full@m2"), "b": parse_spec("shared:a"), "c": parse_spec("lora")}, "m1")
    {'a': 'm2', 'b': 'm2', 'c': 'm1'}
    """
    own = {role: s.model or default for role, s in specs.items()}
    return {role: own[s.of] if s.kind == "shared" and s.of in own else own[role] for role, s in specs.items()}


def weight_groups(specs: Mapping[str, WeightSpec]) -> dict[str, list[str]]:
    """The trained weights: owner role (``full`` or ``lora``) -> the roles whose samples train them (itself first);
    frozen roles left out."""
    groups: dict[str, list[str]] = {}
    for role, s in specs.items():
        if s.kind in ("full", "lora"):
            groups.setdefault(role, []).insert(0, role)
        elif s.kind == "shared":
            groups.setdefault(s.of or "", []).append(role)
    return groups


__all__ = [
    "KINDS",
    "WeightSpec",
    "effective_role_weights",
    "owners",
    "parse_spec",
    "role_models",
    "role_specs",
    "spec_problems",
    "weight_groups",
]
