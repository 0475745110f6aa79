"""The multi-seed ablation report (``mappa report ablation``) on handwritten ablation folders with known answers:
a difference seen on one seed only is not significant once pooled; the same moderate difference on every seed is;
Holm, category counts and the command end to end."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from benchmarks.ablation import crossed_mean, load_ablation, minimum_detectable_difference, per_seed_sd, summarize
from benchmarks.cli import main
from mappa_envs.metrics import paired_test

P = 96
IDS = [f"p{i}" for i in range(P)]


def _correct(indices, n=P):
    chosen = set(indices)
    return [i in chosen for i in range(n)]


def _eval(split, outcomes, categories=None):
    ev = {"split": split, "task_ids": IDS[: len(outcomes)], "outcomes": outcomes}
    ev["accuracy"] = sum(outcomes) / len(outcomes)
    return ev | ({"categories": categories} if categories else {})


def write_ablation(root, after, before, info=None, categories=None, extra=None, unfinished=()):
    """An ablation folder: ``after[arm][seed]`` and ``before[seed]`` outcome lists on problems p0, p1...; ``extra``
    another split as ``(name, before[seed], after[arm][seed])``; ``unfinished`` (arm, seed) runs without "after"."""
    info = info or {}
    seeds = sorted(next(iter(after.values())))
    arms = [{"name": a, "information": info.get(a, "outcome")} for a in after]
    root.mkdir(parents=True, exist_ok=True)
    (root / "ablation.json").write_text(json.dumps({"arms": arms, "seeds": seeds, "preset": "test"}))
    for arm in after:
        for seed in seeds:
            run = root / arm / f"seed-{seed}"
            run.mkdir(parents=True)
            (run / "config.json").write_text(json.dumps({"reward_information": info.get(arm, "outcome")}))
            metrics = [{"iteration": i, "accuracy": 0.2 + 0.1 * i + 0.01 * seed} for i in range(3)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
            ev = {
                "before": _eval("main", before[seed], categories),
                "after": _eval("main", after[arm][seed], categories),
            }
            if extra:
                name, extra_before, extra_after = extra
                pair = {"before": _eval(name, extra_before[seed]), "after": _eval(name, extra_after[arm][seed])}
                ev["splits"] = {name: pair}
            if (arm, seed) in unfinished:
                del ev["after"]
            (run / "eval.json").write_text(json.dumps(ev))
    return root


def _only(summary, a="A", b="B", split="main"):
    (d,) = [d for d in summary["differences"] if (d["a"], d["b"], d["split"]) == (a, b, split)]
    return d


def test_a_difference_on_one_seed_only_is_not_significant_pooled(tmp_path):
    """Seed 0: A 60/96, B 20/96 (A better on 40 problems, never worse); seeds 1 and 2: A and B alike. Seed 0 alone
    is overwhelming by McNemar; pooled over seeds, the seed-to-seed variation of the difference keeps it open."""
    before = {s: _correct(range(30)) for s in range(3)}
    after = {
        "A": {0: _correct(range(60)), 1: _correct(range(40)), 2: _correct(range(40))},
        "B": {0: _correct(range(20)), 1: _correct(range(40)), 2: _correct(range(40))},
    }
    d = _only(summarize(load_ablation(write_ablation(tmp_path, after, before))))
    single = paired_test(IDS, after["B"][0], after["A"][0])
    assert single["p_value"] < 1e-6
    assert d["per_seed"][0]["p_value"] == pytest.approx(single["p_value"])
    assert [x["difference"] for x in d["per_seed"]] == pytest.approx([40 / 96, 0, 0])
    assert d["estimate"] == pytest.approx(40 / 288, abs=1e-9)
    assert d["p_value"] > 0.05
    assert d["low"] < 0 < d["high"]
    assert d["df"] < 3  # the seed component dominates: about S - 1 degrees of freedom


def _moderate(shift):
    """Every seed: A right on 8 problems where B is wrong, B on 2 where A is wrong (McNemar 8 vs 2: p = 0.109),
    both right on p50-p89; ``shift`` moves the 10 discordant problems from seed to seed (0: the same problems)."""
    after = {"A": {}, "B": {}}
    for s in range(3):
        start = 10 * s * shift
        after["A"][s] = _correct([*range(50, 90), *range(start, start + 8)])
        after["B"][s] = _correct([*range(50, 90), start + 8, start + 9])
    return after


def test_the_same_moderate_difference_on_every_seed_is_significant_pooled(tmp_path):
    after = _moderate(shift=1)
    before = {s: _correct(range(50, 80)) for s in range(3)}
    d = _only(summarize(load_ablation(write_ablation(tmp_path, after, before))))
    for s in range(3):
        assert paired_test(IDS, after["B"][s], after["A"][s])["p_value"] > 0.05
    assert [x["p_value"] for x in d["per_seed"]] == pytest.approx([0.109375] * 3)
    assert abs(d["estimate"] - 6 / 96) < 1e-9
    assert d["p_value"] < 0.05
    assert d["var_seed"] == 0.0  # the seeds agree exactly


def test_a_difference_carried_by_the_same_problems_on_every_seed_is_not_multiplied_by_the_seeds(tmp_path):
    """The same 8 vs 2 problems on every seed: evidence about 10 problems, not 30 (problem variance)."""
    d = _only(
        summarize(load_ablation(write_ablation(tmp_path, _moderate(shift=0), {s: [False] * P for s in range(3)})))
    )
    assert abs(d["estimate"] - 6 / 96) < 1e-9
    assert d["p_value"] > 0.05
    assert d["var_problem"] > 0


def test_holm_over_every_pairwise_comparison_of_every_split(tmp_path):
    rng = np.random.default_rng(0)
    rates = {"A": 0.6, "B": 0.45, "C": 0.3}
    after = {a: {s: (rng.random(P) < r).tolist() for s in range(3)} for a, r in rates.items()}
    hard = {a: {s: (rng.random(P) < r / 2).tolist() for s in range(3)} for a, r in rates.items()}
    before = {s: (rng.random(P) < 0.3).tolist() for s in range(3)}
    root = write_ablation(tmp_path, after, before, extra=("hard", before, hard))
    diffs = summarize(load_ablation(root))["differences"]
    assert len(diffs) == 6  # 3 pairs x 2 splits
    raw = [d["p_value"] for d in diffs]
    assert [d["p_holm"] for d in diffs] == pytest.approx(list(multipletests(raw, method="holm")[1]))
    assert all(d["p_holm"] >= d["p_value"] for d in diffs)


def test_category_counts_pooled_over_seeds(tmp_path):
    categories = ["add", "add", "mul", "add,mul"]
    before = {0: [False, True, False, False], 1: [False, True, False, False]}
    after = {
        "A": {0: [True, True, False, True], 1: [True, False, True, False]},
        "B": {0: [False, True, False, False], 1: [True, True, False, False]},
    }
    root = write_ablation(tmp_path, after, before, info={"A": "outcome+per-action-answer-key"}, categories=categories)
    rows = {(c["arm"], c["category"]): c for c in summarize(load_ablation(root))["categories"]}
    # A: add is p0, p1 on 2 seeds: before 0+1+0+1 = 2, after 1+1+1+0 = 3 of 4
    assert {k: rows["A", "add"][k] for k in ("episodes", "before", "after", "seeds")} == {
        "episodes": 4,
        "before": 2,
        "after": 3,
        "seeds": 2,
    }
    assert (rows["A", "mul"]["before"], rows["A", "mul"]["after"], rows["A", "mul"]["episodes"]) == (0, 1, 2)
    assert (rows["A", "add,mul"]["after"], rows["B", "add,mul"]["after"]) == (1, 0)
    assert (rows["B", "add"]["after"], rows["B", "add"]["episodes"]) == (3, 4)
    assert rows["A", "add"]["information"] == "outcome+per-action-answer-key"


def test_missing_categories_are_one_category(tmp_path):
    before = {0: [False] * 4}
    root = write_ablation(tmp_path, {"A": {0: [True] * 4}, "B": {0: [False] * 4}}, before)
    assert {c["category"] for c in summarize(load_ablation(root))["categories"]} == {"all"}


def test_report_ablation_end_to_end(tmp_path, capsys):
    info = {"A": "final-answer-key", "B": "none"}
    before = {s: _correct(range(30)) for s in range(3)}
    after = _moderate(shift=1)
    hard = {a: {s: _correct(range(10 if a == "A" else 5)) for s in range(3)} for a in after}
    root = write_ablation(tmp_path / "abl", after, before, info, extra=("hard", before, hard), unfinished=[("B", 2)])
    assert main(["report", "ablation", str(root)]) == 0
    out = root / "report"
    md = (out / "ablation.md").read_text()
    assert md.strip() in capsys.readouterr().out
    assert (out / "learning_curves.png").stat().st_size > 0
    for text in ("| A |", "| B |", "final-answer-key", "none", "p (Holm)", "95% interval", "B/seed-2", "hard"):
        assert text in md, text
    report = json.loads((out / "ablation.json").read_text())
    assert report["finished_runs"] == 5 and len(report["skipped"]) == 1
    d = _only(report)
    assert [x["seed"] for x in d["per_seed"]] == [0, 1]  # seed 2 of B unfinished: paired on seeds 0 and 1
    interval = f"{100 * d['estimate']:+.1f} pts [{100 * d['low']:+.1f} pts, {100 * d['high']:+.1f} pts]"
    assert interval in md and f"{d['p_holm']:.3g}" in md
    curve = [c for c in report["curves"] if c["arm"] == "B"]
    assert [c["seeds"] for c in curve] == [2, 2, 2] and curve[0]["max"] == pytest.approx(0.21)


def test_an_ablation_with_no_finished_run_is_reported_not_crashed(tmp_path):
    root = write_ablation(
        tmp_path, {"A": {0: [True]}, "B": {0: [False]}}, {0: [False]}, unfinished=[("A", 0), ("B", 0)]
    )
    assert main(["report", "ablation", str(root), "--out", str(tmp_path / "r")]) == 1
    assert "0 runs finished, 2 skipped" in (tmp_path / "r" / "ablation.md").read_text()


def test_crossed_components_are_the_reml_estimates():
    """On a balanced table away from the boundary the ANOVA components equal statsmodels MixedLM's REML fit."""
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(1)
    cells = 0.5 + rng.normal(0, 0.1, (5, 1)) + rng.normal(0, 0.2, (1, 40)) + rng.normal(0, 0.3, (5, 40))
    est = crossed_mean(cells)
    seed, problem = np.indices(cells.shape)
    frame = pd.DataFrame({"y": cells.ravel(), "seed": seed.ravel(), "problem": problem.ravel(), "g": 0})
    vc = {"seed": "0 + C(seed)", "problem": "0 + C(problem)"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = smf.mixedlm("y ~ 1", frame, groups="g", vc_formula=vc, re_formula="0").fit(reml=True)
    reml = dict(zip(fit.model.exog_vc.names, fit.vcomp, strict=True))
    assert est.var_seed == pytest.approx(reml["seed"], rel=1e-3)
    assert est.var_problem == pytest.approx(reml["problem"], rel=1e-3)
    assert est.var_residual == pytest.approx(fit.scale, rel=1e-3)
    assert est.se == pytest.approx(fit.bse_fe.iloc[0], rel=1e-3)


def test_minimum_detectable_difference_shrinks_with_seeds():
    est = crossed_mean(np.random.default_rng(2).random((3, 50)) < 0.5)
    mdd = [minimum_detectable_difference(per_seed_sd(est, n), n) for n in (3, 5, 10)]
    assert mdd == sorted(mdd, reverse=True) and 0 < mdd[-1] < mdd[0]
    assert np.isnan(minimum_detectable_difference(0.1, 1))


def test_sums_of_squares_are_statsmodels_two_way_anova():
    from statsmodels.formula.api import ols
    from statsmodels.stats.anova import anova_lm

    from benchmarks.ablation import _sums_of_squares

    cells = np.random.default_rng(3).random((3, 8))
    seed, problem = np.indices(cells.shape)
    frame = pd.DataFrame({"y": cells.ravel(), "seed": seed.ravel(), "problem": problem.ravel()})
    table = anova_lm(ols("y ~ C(seed) + C(problem)", frame).fit())
    ours = _sums_of_squares(cells)
    for key, row in (("seed", "C(seed)"), ("problem", "C(problem)"), ("residual", "Residual")):
        assert ours[key] == pytest.approx((table.sum_sq[row], table.df[row]))


def test_no_figure_without_matplotlib(tmp_path, monkeypatch, capsys):
    import sys

    from benchmarks.ablation_report import plot_learning_curves

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    curves = [{"arm": "A", "information": "none", "iteration": 0, "seeds": 1, "mean": 0.5, "min": 0.5, "max": 0.5}]
    assert plot_learning_curves({"curves": curves}, tmp_path / "c.png") is None
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_lenient_accuracy_is_reported_beside_the_strict_one(tmp_path):
    """Evaluations that hold a lenient grade per episode (MathChat: an unboxed final number counts too) get it beside
    the strict accuracy, per arm and split: the same episodes, so strict minus lenient is what boxing accounts for.
    Evaluations without one (older runs, other tasks) get no lenient figure."""
    from benchmarks.ablation_report import format_markdown

    before = {0: [False, False, True, False], 1: [False, False, True, False]}
    after = {"A": {0: [True, False, True, False], 1: [True, True, True, False]}, "B": {0: [False] * 4, 1: [False] * 4}}
    root = write_ablation(tmp_path / "abl", after, before)
    summary = summarize(load_ablation(root))
    assert all("lenient" not in a for a in summary["accuracy"])
    assert "lenient: before" not in format_markdown(summary)
    for arm in after:  # every 'after' episode of A computed the answer; B's only unboxed on p1
        for seed in (0, 1):
            path = root / arm / f"seed-{seed}" / "eval.json"
            ev = json.loads(path.read_text())
            ev["before"]["lenient_outcomes"] = [False, True, True, False]
            ev["after"]["lenient_outcomes"] = [True] * 4 if arm == "A" else [False, True, False, False]
            path.write_text(json.dumps(ev))
    summary = summarize(load_ablation(root))
    got = {a["arm"]: a["lenient"] for a in summary["accuracy"]}
    assert got["A"] == pytest.approx({"before": 0.5, "after": 1.0, "change": 0.5})
    assert got["B"] == pytest.approx({"before": 0.5, "after": 0.25, "change": -0.25})
    strict = {a["arm"]: a["after"]["estimate"] for a in summary["accuracy"]}
    assert strict["A"] == pytest.approx(5 / 8) and strict["B"] == 0.0
    md = format_markdown(summary)
    assert "lenient: before -> after (change)" in md and "50.0% -> 100.0% (+50.0 pts)" in md
