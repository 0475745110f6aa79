"""Options in one place: every field of TrainConfig and EvalConfig is a flag of its command, generated from the field
(name, type, Literal choices, docstring help), and the flags give back exactly the fields' values; a field added to
a configuration shows up in ``mappa train -h`` with nothing else written. Fast: no env is run, no model loaded."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

import pytest

from baselines.config import TrainConfig
from baselines.evaluation.evaluate import EvalConfig
from baselines.fields import base_type, choices, field_types, flag, negative_flags, option, resume_may_change
from baselines.planning import checks
from baselines.planning.memory import as_flags
from baselines.planning.presets import preset
from baselines.runs.store import RESUME_MAY_CHANGE
from benchmarks import cli
from benchmarks.commands import ablate
from benchmarks.commands import evaluate as eval_command
from benchmarks.commands import train as train_command
from benchmarks.commands.options import add_options, as_argv, given


def _parser(command: str) -> argparse.ArgumentParser:
    """The subcommand's own parser, as ``mappa`` builds it."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS}


def _other_value(cls: type, f: dataclasses.Field):
    """A value of field ``f`` other than its default, of its type."""
    tp = base_type(field_types(cls)[f.name])
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    values = typing.get_args(tp) if typing.get_origin(tp) is Literal else None
    if values:
        return next(v for v in values if v != default)
    if tp is bool:
        return not default
    if tp in (int, float):
        return tp((default or 0) + 3)
    if tp is str:
        return f"{default or 'x'}-other"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        return ("a", "b") if args[1:] == (Ellipsis,) else tuple(args[0](i + 0.5) for i in range(len(args)))
    if origin is dict:
        return {"k": "v", "n": "x=y"} if args[1] is str else {"k": 2, "s": "text", "quoted": "3", "flag": True}
    raise AssertionError(f"no sample value for {f.name}: {tp}")


def test_every_train_config_field_is_a_flag_with_help_and_its_type():
    actions = _actions(_parser("train"))
    types = field_types(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        a = actions.get(f.name)
        assert a is not None, f"TrainConfig.{f.name} has no flag in mappa train"
        assert flag(f) in a.option_strings and a.help and len(a.help) > 10, f.name
        assert a.default is None, f"{f.name}: a flag not given must keep the preset's value"
        tp = base_type(types[f.name])
        if tp is bool:
            # one --x / --no-x pair per boolean; a field's older spellings are hidden aliases that warn
            assert a.option_strings == [flag(f), negative_flags(f)[0]] and a.nargs == 0, f.name
        elif typing.get_origin(tp) is Literal:
            assert tuple(a.choices) == typing.get_args(tp), f.name
        elif tp in (int, float, str):
            assert a.type is tp and a.choices is None, f.name
    flags_of_fields = {a.dest for a in actions.values()} - {
        "preset",
        "config",
        "list_presets",
        "dry_run",
        "verbose",
        "ray_address",
        "help",
    }
    assert flags_of_fields == {f.name for f in dataclasses.fields(TrainConfig)}  # and no flag without a field


def test_every_field_given_on_the_command_line_reaches_the_configuration():
    """Each field set to another value through its generated flags (as_argv) and parsed back (given, train_config)
    is that value; every field at once, and the flags that existed before the generation still mean the same."""
    base = preset("demo")
    values = {f.name: _other_value(TrainConfig, f) for f in dataclasses.fields(TrainConfig)}
    values["env_id"] = base.env_id  # another env drops the preset's env_kwargs (tested below)
    expected = {k: {**getattr(base, k), **v} if isinstance(v, dict) else v for k, v in values.items()}
    for name, value in values.items():
        argv = ["train", "--preset", "demo", *as_argv(TrainConfig, {name: value})]
        cfg = train_command.train_config(cli.build_parser().parse_args(argv))
        assert getattr(cfg, name) == expected[name] and type(getattr(cfg, name)) is type(expected[name]), name
    cfg = train_command.train_config(
        cli.build_parser().parse_args(["train", "--preset", "demo", *as_argv(TrainConfig, values)])
    )
    assert dataclasses.asdict(cfg) == expected
    old = ["--no-mask-coach-fallbacks", "--no-share-prefix", "--no-rollout-logprobs", "--no-memory-check"]
    old += ["--no-resume", "--no-progress", "--gradient-checkpointing", "--concurrent-generation", "--unseal-test"]
    old += ["--out", "o", "--place", "engines=gen", "--eval-extra-split", "a", "--eval-extra-split", "b"]
    cfg = train_command.train_config(cli.build_parser().parse_args(["train", "--preset", "smoke", *old]))
    assert (cfg.mask_coach_fallbacks, cfg.share_prefix, cfg.rollout_logprobs, cfg.memory_check) == (False,) * 4
    assert not cfg.resume and not cfg.progress and cfg.gradient_checkpointing and cfg.concurrent_generation
    assert cfg.unseal_test and cfg.out_dir == "o" and cfg.eval_extra_splits == ("a", "b")
    assert cfg.placement == {"engines": "gen"}


def test_an_old_spelling_still_works_hidden_and_warns(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--preset", "smoke", "--keep-coach-fallbacks"])
    assert train_command.train_config(args).mask_coach_fallbacks is False
    assert "--keep-coach-fallbacks is an old spelling of --no-mask-coach-fallbacks" in capsys.readouterr().err
    assert "--keep-coach-fallbacks" not in _parser("train").format_help()
    args = parser.parse_args(["ablate", "--preset", "smoke", "--estimators", "coach,grpo"])
    assert args.arms == "coach,grpo" and "--estimators is an old spelling of --arms" in capsys.readouterr().err
    args = parser.parse_args(["rescore", "runs/x", "--coach", "rule", "--out", "o", "--max-tokens", "64"])
    assert args.max_tokens == 64 and "--max-tokens is an old spelling of --max-new-tokens" in capsys.readouterr().err
    assert "--max-tokens" not in _parser("rescore").format_help()
    assert cli.main(["envs"]) == 0  # `mappa env list`, warned, and left out of the help
    out, err = capsys.readouterr()
    assert "mappa/MathChat-v0" in out and "use mappa env list" in err
    assert not any(line.split()[:1] == ["envs"] for line in cli.build_parser().format_help().splitlines())
    assert cli.main(["env", "list"]) == 0 and "mappa/MathChat-v0" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--place takes ACTOR=RESOURCE"):
        train_command.train_config(cli.build_parser().parse_args(["train", "--place", "engines"]))


def test_another_env_drops_the_presets_env_arguments_and_held_out_split():
    cfg = train_command.train_config(cli.build_parser().parse_args(["train", "--preset", "demo-v1", "--env", "x/Y-v0"]))
    assert cfg.env_kwargs == {} and cfg.eval_split is None and cfg.env_id == "x/Y-v0"
    argv = ["train", "--preset", "demo-v1", "--env-arg", "turns=2", "--env-arg", 'prompt_style="small"']
    cfg = train_command.train_config(cli.build_parser().parse_args(argv))
    assert cfg.env_kwargs == {**preset("demo-v1").env_kwargs, "turns": 2, "prompt_style": "small"}
    assert cfg.eval_split == preset("demo-v1").eval_split


@dataclass
class _DummyConfig(TrainConfig):
    dummy_knob: int = 7
    """A dummy option added in a test, documented only here."""
    dummy_mode: Literal["fast", "careful"] = option("fast", flag="--dummy")
    """Another one, with choices and its own flag."""


def test_a_field_added_to_the_configuration_shows_up_in_mappa_train_help(capsys):
    parser = argparse.ArgumentParser(prog="mappa")
    train_command.add_parser(parser.add_subparsers(dest="command"), config=_DummyConfig)
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--dummy-knob DUMMY_KNOB A dummy option added in a test, documented only here" in text
    assert "--dummy {fast,careful} Another one, with choices and its own flag" in text
    args = parser.parse_args(["train", "--dummy-knob", "9", "--dummy", "careful"])
    assert given(args, _DummyConfig)["dummy_knob"] == 9 and args.dummy_mode == "careful"
    assert choices(_DummyConfig, "dummy_mode") == ("fast", "careful")
    bad = _DummyConfig(dummy_mode="reckless")  # type: ignore[arg-type]
    assert any("dummy_mode must be 'fast' or 'careful'" in p for p in checks.choice_problems(bad))


def test_the_checks_read_their_choices_from_the_types(monkeypatch):
    assert choices(TrainConfig, "trainer") == ("ray", "local")
    assert choices(TrainConfig, "zero_stage") == (0, 1, 2, 3)
    cfg = dataclasses.replace(preset("smoke"), lr_schedule="linear", device="tpu", dtype="int8", zero_stage=5)
    problems = checks.choice_problems(cfg)
    assert "lr_schedule must be 'cosine' or 'constant', not 'linear'" in problems
    assert "zero_stage must be 0, 1, 2 or 3, not 5" in problems
    assert any(p.startswith("device must be") for p in problems) and any(p.startswith("dtype must") for p in problems)
    assert checks.choice_problems(preset("smoke")) == []
    with pytest.raises(ValueError, match="lr_schedule must be 'cosine' or 'constant'"):
        cfg.lr_at(5)


def test_resume_rule_and_memory_suggestions_read_the_fields():
    assert resume_may_change(TrainConfig) == RESUME_MAY_CHANGE
    assert {"iterations", "out_dir", "micro_batch", "pack_tokens", "gradient_checkpointing"} <= RESUME_MAY_CHANGE
    assert not {"lr", "seed", "estimator", "coach", "model", "env_kwargs"} & RESUME_MAY_CHANGE
    suggestion = {"zero_stage": 0, "gradient_checkpointing": True, "micro_batch": 1, "engine_kv_cache_gb": 1.0}
    text = as_flags(suggestion)
    assert text == "--zero-stage 0 --gradient-checkpointing --micro-batch 1 --engine-kv-cache-gb 1"
    cfg = train_command.train_config(cli.build_parser().parse_args(["train", *text.split()]))
    assert {k: getattr(cfg, k) for k in suggestion} == suggestion


def test_mappa_ablate_takes_train_options_and_passes_them_to_every_arm(tmp_path):
    argv = ["ablate", "--preset", "smoke", "--lr", "1e-5", "--no-share-prefix", "--trainer", "local"]
    argv += ["--role-weights", "verifier=frozen", "--eval-extra-split", "s1", "--unseal-test", "--seed", "4"]
    args = cli.build_parser().parse_args([*argv, "--out", str(tmp_path)])
    own = set(ablate.ARM_FIELDS)
    assert own <= {f.name for f in dataclasses.fields(TrainConfig)}
    assert {a.dest for a in _parser("ablate")._actions} >= {f.name for f in dataclasses.fields(TrainConfig)} - own
    run = ablate._arm_argv(args, {"estimator": "grpo", "coach": "none"}, tmp_path / "grpo" / "seed-4", 4)
    cfg = train_command.train_config(ablate._train_parser().parse_args(run))
    assert (cfg.lr, cfg.share_prefix, cfg.trainer, cfg.role_weights) == (1e-5, False, "local", {"verifier": "frozen"})
    assert cfg.eval_extra_splits == ("s1",) and cfg.unseal_test and cfg.seed == 4 and not cfg.progress
    assert (cfg.estimator, cfg.coach, cfg.out_dir) == ("grpo", "none", str(tmp_path / "grpo" / "seed-4"))
    plain = ablate._arm_argv(
        cli.build_parser().parse_args(["ablate", "--preset", "smoke"]), {"estimator": "grpo"}, tmp_path, 0
    )
    head = ["train", "--preset", "smoke", "--out", str(tmp_path), "--seed", "0", "--estimator", "grpo"]
    assert plain == [*head, "--no-progress"]


def test_mappa_eval_builds_its_eval_config_from_the_generated_flags():
    parser = _parser("eval")
    actions = _actions(parser)
    own = set(eval_command.EVAL_OWN)
    for f in dataclasses.fields(EvalConfig):
        if f.name in own:
            continue
        a = actions.get(f.name)
        assert a is not None and flag(f) in a.option_strings and a.help, f"EvalConfig.{f.name}: no flag in mappa eval"
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert a.default == default, f"{f.name}: the flag's default is the field's"
    assert {"--suites", "--tasks", "--env-arg"} <= set(parser._option_string_actions)
    assert own <= {f.name for f in dataclasses.fields(EvalConfig)}
    values = {f.name: _other_value(EvalConfig, f) for f in dataclasses.fields(EvalConfig) if f.name not in own}
    args = parser.parse_args(["--suites", "aime", *as_argv(EvalConfig, values)])
    cfg = eval_command._eval_config(args)
    assert {k: getattr(cfg, k) for k in values} == values and cfg.suites == ("aime",)
    assert eval_command._eval_config(parser.parse_args([])) == EvalConfig(
        suites=EvalConfig().suites, mathchat_kwargs={}, dsbench_kwargs={}
    )


def test_a_config_field_the_generator_cannot_give_is_refused():
    @dataclass
    class Odd:
        when: complex = 1j
        """A type with no command-line form."""

    parser = argparse.ArgumentParser()
    with pytest.raises(TypeError, match=r"Odd\.when: no command-line form"):
        add_options(parser, Odd)
    assert as_argv(TrainConfig, {"env_kwargs": {"n": "3", "m": "x"}}) == ["--env-arg", 'n="3"', "--env-arg", "m=x"]
