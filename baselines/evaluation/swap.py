"""Which role's training mattered: a trained team evaluated with one role's weights swapped, or with every
combination of trained and untrained roles (``mappa eval --run RUN --swap-matrix``), all on the same episodes.

Each combination is a team (:func:`baselines.evaluation.teams.team_from_args`'s format); engines are built once per
model and shared by every combination that uses it. Every row is compared, with the exact paired test of
:func:`baselines.evaluation.evaluate.paired_comparison`, against the untrained team (all base) and the trained one.

>>> [sorted(c) for c, _ in swap_teams(["a", "b"], {"a": {"model": "A"}, "b": {"model": "B"}}, {"a": {"model": "0"},
...  "b": {"model": "0"}})]
[[], ['a'], ['b'], ['a', 'b']]
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from baselines.evaluation import teams  # teams.build_policies at call time (a test replaces it)
from baselines.evaluation.evaluate import EvalConfig, evaluate, paired_comparison

Team = Mapping[str, Mapping[str, str]]


def swap_teams(roles: Sequence[str], trained: Team, base: Team) -> list[tuple[frozenset[str], dict[str, Any]]]:
    """Every combination: (the roles that play with their trained weights, the team), from none to all."""
    out = []
    for k in range(len(roles) + 1):
        for subset in itertools.combinations(roles, k):
            team = {r: dict(trained[r] if r in subset else base[r]) for r in roles}
            out.append((frozenset(subset), team))
    return out


def combination_name(roles: Sequence[str], subset: frozenset[str]) -> str:
    """``trained: solver+verifier`` style, in role order; ``base`` and ``trained: all`` at the ends."""
    if not subset:
        return "base"
    if len(subset) == len(roles):
        return "trained: all"
    return "trained: " + "+".join(r for r in roles if r in subset)


def swap_matrix(
    roles: Sequence[str], trained: Team, base: Team, cfg: EvalConfig, out_dir: str | Path, log: Any = print
) -> dict[str, Any]:
    """Evaluate every combination of ``trained`` and ``base`` per role on ``cfg``'s suites (the same episodes),
    each into ``out_dir/<combination>/``; returns the rows with their paired tests against base and all-trained,
    also written to ``out_dir/swap_matrix.json``."""
    out = Path(out_dir)
    engines: dict[str, Any] = {}  # one engine per model, shared across combinations
    results = []
    for subset, team in swap_teams(roles, trained, base):
        name = combination_name(roles, subset)
        log(f"[swap matrix] {name}")
        folder = out / ("-".join(r for r in roles if r in subset) or "base")
        result = evaluate(teams.build_policies(team, cfg, engines=engines), cfg, out_dir=folder, team=team, log=log)
        results.append((subset, name, result))
    first, last = results[0][2], results[-1][2]
    rows = [
        {
            "combination": name,
            "trained_roles": [r for r in roles if r in subset],
            "vs_base": paired_comparison(result, first),
            "vs_trained": paired_comparison(result, last),
        }
        for subset, name, result in results
    ]
    matrix = {"roles": list(roles), "trained": dict(trained), "base": dict(base), "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "swap_matrix.json").write_text(json.dumps(matrix, indent=1, default=str))
    return matrix


def format_swap_matrix(matrix: Mapping[str, Any]) -> str:
    """One Markdown table per suite: each combination's score with its Wilson interval, and its paired test against
    the base team and the all-trained team (gained / lost episodes, two-sided p)."""
    lines: list[str] = []
    suites = list(matrix["rows"][0]["vs_base"]) if matrix["rows"] else []
    for suite in suites:
        lines += [
            f"{suite}:",
            "| trained roles | score [95% CI] | vs base: gained / lost, p | vs all trained: gained / lost, p |",
            "|---|---|---|---|",
        ]
        for row in matrix["rows"]:
            b, t = row["vs_base"][suite], row["vs_trained"][suite]
            lo, hi = b["ci95_a"]
            lines.append(
                f"| {row['combination']} | {b['score_a']:.1%} [{lo:.0%}, {hi:.0%}] | {b['gained']} / {b['lost']}, "
                f"{b['p_value']:.3g} | {t['gained']} / {t['lost']}, {t['p_value']:.3g} |"
            )
        lines.append("")
    return "\n".join(lines)


__all__ = ["combination_name", "format_swap_matrix", "swap_matrix", "swap_teams"]
