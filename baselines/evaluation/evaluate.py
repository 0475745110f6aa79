"""Evaluation of a team on suites of any registered task (AIME-32, AMC-32, DSBench-lite eval, SQLQuery's held-out
questions...), k samples per problem, with intervals.

A *team* gives each role a policy (:mod:`baselines.evaluation.teams`): a local model (bundled name, model folder, or the
``models/<role>`` folders a ``mappa train`` run exports) generated with an in-process vLLM engine (one per distinct
model, shared by the roles that use it) or with transformers, or an OpenAI-compatible endpoint per role (``vllm
serve``, hosted APIs).

Every suite runs ``k`` samples of each problem (episode seeds ``seed + index``), with no coach. Results, by the
task's declared outcome kind (``PipelineEnv.outcome_kind``):

- ``answer`` (MathChat, SQLQuery): accuracy over all samples with a 95% Wilson interval, problems solved at least
  once (pass@k);
- ``graded`` (DSBench): success rate (valid submission) with its interval, mean normalised quality with a 95% normal
  interval, and per task the metric, mean value, quality and valid samples;
- per role: actions, tool-call rate, tool success rate, mean response length (characters and words).

Suites come from the registry and the tasks' declarations (:mod:`mappa_envs.suites`): a named suite (``aime``,
``amc``, ``dsbench``), ``<task>`` (its held-out tasks: ``sql``), ``<task>:<split>`` (``sql:eval``,
``mathchat:arith1-eval``, ``dsbench:train``), ``tasks:<file>`` (a MathChat task file, the format of
``make(..., data_file=)``) or ``<env id>[:<split>]``; every task takes the same path.

:func:`paired_comparison` compares two teams evaluated on the same episodes (same suites, seeds and ``k``): per
suite both scores with intervals and an exact McNemar test on the per-episode outcomes (``success``: correct, or a
valid DSBench submission).

``mappa eval`` prints the tables and writes ``eval.json`` plus each suite's trajectories (JSON lines), which
``mappa report`` reads.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import mappa_envs
from baselines.config import Dtype
from baselines.evaluation.rollout import run_episodes
from mappa_envs.core import EpisodeRecord, write_jsonl
from mappa_envs.metrics import paired_test, role_stats, wilson_interval
from mappa_envs.sealed import code_version, is_sealed, log_access, refuse
from mappa_envs.suites import Suite, resolve_suite


@dataclass
class EvalConfig:
    suites: tuple[str, ...] = ("aime", "amc", "dsbench")
    k: int = 1
    """Samples per problem."""
    seed: int = 0
    """Seed of the sampling."""
    temperature: float = 0.6
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling's probability mass (1: off)."""
    max_new_tokens: int = 512
    """Tokens per reply at most."""
    max_prompt_tokens: int = 3072
    """Prompt tokens a role sees at most (a longer context keeps its end)."""
    limit: int | None = None
    """Only the first ``limit`` problems of each suite (quick looks; the full sets are the benchmark)."""
    concurrency: int = 16
    """Episodes in flight."""
    engine: Literal["vllm", "transformers"] = "vllm"
    """Local models: ``vllm`` (in-process engine) or ``transformers``."""
    engine_dtype: Dtype = "auto"
    """The vLLM engine's dtype: as ``TrainConfig.engine_dtype`` ('auto': bfloat16 where the device computes it
    natively, as the training run's engines), 'float32' or 'bfloat16'."""
    dsbench_data_dir: str | None = None
    """Evaluate on the original DSBench eval tasks at this path instead of DSBench-lite's."""
    sandbox: str | None = None
    """Sandbox backend for every suite (default: each env's)."""
    unseal_test: bool = False
    """Evaluate sealed test splits (:mod:`mappa_envs.sealed`): pre-registered runs only; each look is logged."""
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra env arguments per suite."""
    mathchat_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra env arguments of every MathChat suite (e.g. ``{"prompt_style": "small"}`` for a team trained so)."""
    dsbench_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra env arguments of every DSBench suite (e.g. ``{"role_prompts": "small", "turns": 1}``)."""


# ---------------------------------------------------------------------------------------------- summaries
def behaviour(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, float]]:
    """The paper's behaviour statistics per role."""
    out = {}
    for role, s in role_stats(records).items():
        words = [len(a.output.split()) for r in records for a in r.actions if a.role == role]
        out[role] = {
            "actions": s.actions,
            "tool_call_rate": s.tool_call_rate,
            "tool_success_rate": s.tool_success_rate,
            "mean_chars": s.mean_chars,
            "mean_words": sum(words) / len(words) if words else 0.0,
        }
    return out


def _mean_ci(xs: Sequence[float]) -> tuple[float, float, float]:
    n = len(xs)
    if n == 0:
        return 0.0, 0.0, 0.0
    m = sum(xs) / n
    if n == 1:
        return m, m, m
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = 1.96 * sd / math.sqrt(n)
    return m, max(0.0, m - half), min(1.0, m + half)


def summarize(suite: str, records: Sequence[EpisodeRecord], k: int) -> dict[str, Any]:
    n = len(records)
    graded = any(r.kind == "graded" for r in records)  # the task's declared outcome kind (PipelineEnv.outcome_kind)
    out: dict[str, Any] = {
        "suite": suite,
        "episodes": n,
        "k": k,
        "behaviour": behaviour(records),
        # per episode, in order: what a paired comparison of two teams on the same episodes tests
        "task_ids": [r.task_id for r in records],
        "outcomes": [r.success for r in records],
    }
    if not graded:
        c = sum(r.success for r in records)
        lo, hi = wilson_interval(c, n)
        by_task: dict[str, list[bool]] = {}
        for r in records:
            by_task.setdefault(r.task_id, []).append(r.success)
        out.update(
            kind="answer",
            accuracy=c / n if n else 0.0,
            correct=c,
            ci95=[lo, hi],
            problems=len(by_task),
            solved_at_least_once=sum(any(v) for v in by_task.values()),
        )
    else:
        ok = sum(r.success for r in records)
        lo, hi = wilson_interval(ok, n)
        q, qlo, qhi = _mean_ci([r.quality or 0.0 for r in records])
        tasks: dict[str, dict[str, Any]] = {}
        for r in records:
            assert r.outcome is not None  # a finished episode's
            t = tasks.setdefault(
                r.task_id,
                {"metric": r.outcome.get("metric"), "type": r.outcome.get("task_type"), "values": [], "quality": []},
            )
            t["quality"].append(r.quality or 0.0)
            if r.outcome.get("valid"):
                t["values"].append(float(r.outcome["value"]))
        per_task = {
            tid: {
                "metric": t["metric"],
                "type": t["type"],
                "samples": len(t["quality"]),
                "valid": len(t["values"]),
                "mean_value": sum(t["values"]) / len(t["values"]) if t["values"] else None,
                "mean_quality": sum(t["quality"]) / len(t["quality"]),
            }
            for tid, t in tasks.items()
        }
        out.update(
            kind="graded",
            success_rate=ok / n if n else 0.0,
            successes=ok,
            ci95=[lo, hi],
            mean_quality=q,
            quality_ci95=[qlo, qhi],
            tasks=per_task,
        )
    return out


def _graded(suite: Mapping[str, Any]) -> bool:
    """A suite summary of a graded task (:func:`summarize`; result files written before the outcome kinds said
    "dsbench" for "graded" and "math" for "answer")."""
    return suite["kind"] in ("graded", "dsbench")


def format_tables(result: Mapping[str, Any]) -> str:
    lines = [f"{'suite':<10}{'episodes':>9}  {'score':<34}{'extra'}"]
    for name, s in result["suites"].items():
        lo, hi = s["ci95"]
        if not _graded(s):
            score = f"accuracy {s['accuracy']:.1%} [{lo:.1%}, {hi:.1%}]"
            extra = f"solved at least once: {s['solved_at_least_once']}/{s['problems']}"
        else:
            score = f"success {s['success_rate']:.1%} [{lo:.1%}, {hi:.1%}]"
            qlo, qhi = s["quality_ci95"]
            extra = f"mean quality {s['mean_quality']:.3f} [{qlo:.3f}, {qhi:.3f}]"
        lines.append(f"{name:<10}{s['episodes']:>9}  {score:<34}{extra}")
    for name, s in result["suites"].items():
        if _graded(s):
            lines += [
                "",
                f"{name}: per task",
                f"{'task':<24}{'metric':<10}{'valid':>7}{'mean value':>12}{'quality':>9}",
            ]
            for tid, t in s["tasks"].items():
                v = f"{t['mean_value']:.4g}" if t["mean_value"] is not None else "-"
                lines.append(
                    f"{tid:<24}{t['metric']:<10}{t['valid']:>3}/{t['samples']:<3}{v:>12}{t['mean_quality']:>9.3f}"
                )
    lines += ["", f"{'suite':<10}{'role':<16}{'actions':>8}{'tool calls':>12}{'tool ok':>9}{'chars':>8}{'words':>7}"]
    for name, s in result["suites"].items():
        for role, b in s["behaviour"].items():
            lines.append(
                f"{name:<10}{role:<16}{b['actions']:>8}{b['tool_call_rate']:>12.1%}{b['tool_success_rate']:>9.1%}"
                f"{b['mean_chars']:>8.0f}{b['mean_words']:>7.0f}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- running
def suite_env(suite: str, cfg: EvalConfig) -> tuple[str, dict[str, Any]]:
    """The env id and arguments of ``suite`` (:func:`mappa_envs.suites.resolve_suite`), with ``cfg``'s: the sandbox,
    the extra arguments of its task (:func:`_task_kwargs`), then ``cfg.env_kwargs[suite]``. A sealed split
    (:mod:`mappa_envs.sealed`) is refused unless ``cfg.unseal_test``, which unseals it."""
    s = resolve_suite(suite)
    kwargs = dict(s.kwargs)
    if cfg.sandbox:
        kwargs["sandbox"] = cfg.sandbox
    kwargs.update(_task_kwargs(cfg, s))
    kwargs.update(cfg.env_kwargs.get(suite, {}))
    kwargs.pop("unseal", None)  # unsealing is cfg.unseal_test's alone
    if is_sealed(s.env_id, kwargs):
        if not cfg.unseal_test:
            raise refuse(s.env_id, kwargs["split"])
        kwargs["unseal"] = True
    return s.env_id, kwargs


def _task_kwargs(cfg: EvalConfig, s: Suite) -> dict[str, Any]:
    """The extra arguments of every suite of ``s``'s task: ``cfg.env_kwargs`` under its env id or task name (``sql``),
    after the config's shorthands for the built-in tasks (``mathchat_kwargs``; ``dsbench_data_dir``,
    ``dsbench_kwargs``: what ``mappa eval --env-arg mathchat:...``, ``--dsbench-data-dir`` and ``--env-arg
    dsbench:...`` set)."""
    data_dir = {"suite": "dsbench", "data_dir": cfg.dsbench_data_dir} if cfg.dsbench_data_dir else {}
    shorthands = {"mathchat": cfg.mathchat_kwargs, "dsbench": {**data_dir, **cfg.dsbench_kwargs}}
    return {**shorthands.get(s.task, {}), **cfg.env_kwargs.get(s.env_id, {}), **cfg.env_kwargs.get(s.task, {})}


def _file_name(suite: str) -> str:
    """A suite's trajectory file name: ``tasks:/a/b/sums.jsonl`` -> ``tasks-sums``, ``mathchat:x`` -> ``mathchat-x``,
    ``mappa/SQLQuery-v0:eval`` -> ``mappa_SQLQuery-v0-eval``."""
    kind, colon, rest = suite.partition(":")
    stem = Path(rest).stem if rest and Path(rest).is_file() else rest
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in kind + ("-" + stem if colon else ""))


def evaluate(
    policies: Mapping[str, Any] | Any,
    cfg: EvalConfig,
    *,
    out_dir: str | Path | None = None,
    team: Mapping[str, Any] | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Run every suite of ``cfg`` with ``policies`` (a policy per role name, or one for all)."""
    if cfg.k < 1:
        raise ValueError("k must be >= 1")
    out = Path(out_dir) if out_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "team": dict(team or {}),
        "code_version": code_version(),  # the commit that evaluated it (+dirty: with uncommitted changes)
        "suites": {},
    }
    for suite in cfg.suites:
        env_id, kwargs = suite_env(suite, cfg)
        probe = mappa_envs.make(env_id, **kwargs)
        n_tasks = len(probe.unwrapped.tasks) if cfg.limit is None else min(cfg.limit, len(probe.unwrapped.tasks))
        probe.close()
        t0 = time.perf_counter()
        records = run_episodes(
            functools.partial(mappa_envs.make, env_id, **kwargs),
            policies,
            n_tasks * cfg.k,
            seed=cfg.seed,
            concurrency=cfg.concurrency,
            reset_options=lambda i: {"task_index": i // cfg.k},
        )
        summary = summarize(suite, records, cfg.k)
        if kwargs.get("unseal"):
            correct = sum(bool(r.success) for r in records)
            result_file = out / "eval.json" if out else None
            log_access(env_id, kwargs["split"], episodes=len(records), correct=correct, result_file=result_file)
        summary["seconds"] = round(time.perf_counter() - t0, 1)
        summary["env_id"], summary["env_kwargs"] = env_id, {k: str(v) for k, v in kwargs.items()}
        result["suites"][suite] = summary
        if out:
            path = out / f"{_file_name(suite)}.jsonl"
            write_jsonl(path, records)
            summary["trajectories"] = str(path)
        log(f"[{suite}] {n_tasks} problems x {cfg.k} samples in {summary['seconds']:.0f} s")
    if out:
        (out / "eval.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def paired_comparison(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Team ``a`` against team ``b`` (two :func:`evaluate` results on the same suites and episodes): per suite
    the score of each (accuracy, or a graded task's success rate) with its Wilson interval and the exact McNemar test on
    the per-episode outcomes (``gained``: episodes ``a`` gets right and ``b`` wrong; ``p_value_gain``: one-sided,
    for "``a`` is better"); with k samples per problem, the exact sign test on the problems' mean outcomes
    (:func:`mappa_envs.metrics.paired_test`). A graded task (DSBench) pairs on ``success`` (a valid submission), not
    quality."""
    out = {}
    for suite, sa in a["suites"].items():
        sb = b["suites"].get(suite)
        if sb is None:
            raise ValueError(f"suite {suite!r} was evaluated for one team only")
        if sa["task_ids"] != sb["task_ids"]:
            raise ValueError(f"suite {suite!r}: the teams were evaluated on different episodes (seed, k or limit)")
        test = paired_test(sa["task_ids"], sb["outcomes"], sa["outcomes"])  # "after" = a
        n = len(sa["outcomes"])
        out[suite] = {
            **test,
            "score_a": sum(sa["outcomes"]) / n if n else 0.0,
            "score_b": sum(sb["outcomes"]) / n if n else 0.0,
            "ci95_a": list(wilson_interval(sum(sa["outcomes"]), n)),
            "ci95_b": list(wilson_interval(sum(sb["outcomes"]), n)),
            "score": "success rate" if _graded(sa) else "accuracy",
        }
    return out


def test_name(p: Mapping[str, Any]) -> str:
    """What a :func:`mappa_envs.metrics.paired_test` result was: McNemar on episodes, or the sign test on problems."""
    return "exact McNemar" if p.get("unit", "episode") == "episode" else "exact sign test on problems' k-sample means"


def format_comparison(paired: Mapping[str, Mapping[str, Any]], name_a: str = "a", name_b: str = "b") -> str:
    lines = []
    for suite, p in paired.items():
        lines.append(
            f"{suite}: {p['score']} {name_a} {p['score_a']:.1%} [{p['ci95_a'][0]:.0%}, {p['ci95_a'][1]:.0%}] vs "
            f"{name_b} {p['score_b']:.1%} [{p['ci95_b'][0]:.0%}, {p['ci95_b'][1]:.0%}]; paired ({test_name(p)}, "
            f"{p['pairs']} {p['unit']}s): {name_a} better in {p['gained']}, {name_b} in {p['lost']}, "
            f"p = {p['p_value']:.3g} two-sided ({p['p_value_gain']:.3g} for {name_a} better)"
        )
    return "\n".join(lines)


__all__ = [
    "EvalConfig",
    "evaluate",
    "format_comparison",
    "format_tables",
    "paired_comparison",
    "summarize",
    "test_name",
]
