"""What a new user meets first: `mappa train` without a configuration, configuration files, the help's choice lists
against the code's registries, the dry run building the coach, the sandbox a run records, and a finished run's
checkpoints dropped once its models are exported."""

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

from baselines.config import TrainConfig, config_record, sandbox_choice
from baselines.planning.presets import PRESETS, SUMMARIES, preset
from baselines.runs.store import REMOVED, FinishedRun, check_resumable, drop_finished_checkpoints
from baselines.weights.role_weights import KINDS, SPEC_FORMS, parse_spec
from benchmarks import cli
from benchmarks.commands import ablate
from benchmarks.commands import train as train_command
from mappa_envs.coach import coach_from_spec
from mappa_envs.coach.rescore import _RULE_COACHES, COACH_SPECS

MAPPA = [sys.executable, "-m", "benchmarks.cli"]
EXAMPLES = {
    "MODEL@URL": "smol@http://127.0.0.1:9/v1",
    "package.module:factory": "mappa_envs.coach:LengthCoach",
    "ROLE": "problem_solver",
    "MODEL": "tiny-random",
    "[:RANK]": ":8",
}


def _example(form: str) -> str:
    """A spec of the form ``form`` (``llm:MODEL@URL`` -> ``llm:smol@http://...``)."""
    if form in EXAMPLES:
        return EXAMPLES[form]
    for placeholder, value in EXAMPLES.items():
        form = form.replace(placeholder, value)
    return form


def _help(*command: str) -> str:
    os.environ["COLUMNS"] = "100000"  # no line breaks inside a spec (argparse wraps at hyphens)
    try:
        parser = cli.build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return " ".join(sub.choices[command[0]].format_help().split())
    finally:
        del os.environ["COLUMNS"]


def test_train_without_a_preset_or_config_lists_the_presets_and_starts_nothing(tmp_path):
    proc = subprocess.run([*MAPPA, "train"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and not list(tmp_path.iterdir())
    assert "give a preset (--preset NAME) or a configuration file (--config FILE)" in proc.stderr
    for name in PRESETS:
        assert f"  {name}  " in proc.stderr or proc.stderr.count(name), name
    listed = subprocess.run([*MAPPA, "presets"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and [ln.split()[0] for ln in listed.stdout.splitlines()] == list(PRESETS)


def test_every_preset_has_a_one_line_summary():
    assert set(SUMMARIES) == set(PRESETS) and all(SUMMARIES[n] and "\n" not in SUMMARIES[n] for n in PRESETS)


def _dry_config(argv: list[str]) -> dict:
    """The configuration ``mappa train ... --dry-run`` prints on its first line."""
    proc = subprocess.run([*MAPPA, "train", *argv, "--dry-run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout.splitlines()[0])


def test_a_runs_config_json_reproduces_the_run(tmp_path):
    """A run's config.json (what mappa train writes, with what it records beside the fields) fed back with
    --config resolves to the run's configuration; options given over it replace their fields."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_record(preset("demo")), indent=2))
    again = train_command.train_config(cli.build_parser().parse_args(["train", "--config", str(path)]))
    assert asdict(again) == asdict(preset("demo"))
    out = str(tmp_path / "again")
    expected = json.loads(json.dumps(asdict(replace(preset("demo"), out_dir=out))))  # as JSON writes it
    assert _dry_config(["--config", str(path), "--out", out]) == expected
    over = train_command.train_config(cli.build_parser().parse_args(["train", "--config", str(path), "--seed", "3"]))
    assert over.seed == 3 and replace(over, seed=0) == preset("demo")


def test_a_yaml_config_over_a_preset_and_its_errors(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("iterations: 3\nbetas: [0.9, 0.99]\nlr: 1\nenv_kwargs: {split: arith2-train}\n")
    args = cli.build_parser().parse_args(["train", "--preset", "smoke", "--config", str(path)])
    cfg = train_command.train_config(args)
    assert (cfg.iterations, cfg.betas, cfg.lr, cfg.model) == (3, (0.9, 0.99), 1.0, "tiny-random")
    assert cfg.env_kwargs == {"split": "arith2-train"}
    for text, message in (
        ("iteration: 3\n", "unknown keys ['iteration'] ('iteration': did you mean 'iterations'?)"),
        ("iterations: three\n", "iterations takes a int, not 'three'"),
        ("- a list\n", "holds a mapping of field names to values"),
    ):
        path.write_text(text)
        with pytest.raises(SystemExit, match=re.escape(message)):
            train_command.train_config(cli.build_parser().parse_args(["train", "--config", str(path)]))


def test_the_dry_run_builds_the_coach_it_checks():
    proc = subprocess.run(
        [*MAPPA, "train", "--preset", "smoke", "--dry-run", "--coach", "typo"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "- coach: --coach 'typo': unknown coach spec 'typo'" in proc.stdout


def test_every_coach_the_help_names_is_accepted_and_every_accepted_one_is_named():
    shown = _help("train")
    for form in COACH_SPECS:
        assert f"{form}:" in shown, form
        coach_from_spec(_example(form))  # accepted
    assert set(_RULE_COACHES) <= set(COACH_SPECS)  # every coach taken by name is named
    with pytest.raises(ValueError, match="unknown coach spec 'rule-hindsigt'"):
        coach_from_spec("rule-hindsigt")
    assert "rule-hindsight: the same coach as rule-hindsight-key" in shown  # the alias says what it is
    assert "none: no coach (outcome-only runs)" in shown


def test_every_role_weight_form_the_help_names_is_accepted_and_every_kind_is_named():
    shown = _help("train")
    kinds = set()
    for form, what in SPEC_FORMS.items():
        assert f"{form}: {what}" in shown, form
        kinds.add(parse_spec(_example(form)).kind)
    assert kinds == set(KINDS)
    assert "single-process trainer only" not in shown


def test_every_ablation_arm_is_named_in_the_help():
    shown = _help("ablate")
    assert set(ablate.ARM_HELP) == {name for name, _ in ablate.ABLATION}
    for name, _ in ablate.ABLATION:
        assert f"{name}: {ablate.ARM_HELP[name]}" in shown, name
    assert [n for n, _ in ablate.ablation_arms(",".join(ablate.ARM_HELP))] == list(ablate.ARM_HELP)


def test_a_run_records_its_sandbox(monkeypatch, capsys):
    monkeypatch.setenv("MAPPA_SANDBOX", "subprocess")
    record = config_record(preset("smoke"))["sandbox"]
    assert record == {"backend": "subprocess", "isolated": False, "chosen_by": "$MAPPA_SANDBOX", "passed_over": []}
    cfg = replace(preset("smoke"), env_kwargs={"sandbox": "bubblewrap"})
    assert sandbox_choice(cfg)["backend"] == "bubblewrap" and sandbox_choice(cfg)["isolated"]
    train_command.announce_sandbox(preset("smoke"))
    assert capsys.readouterr().out.startswith("sandbox: subprocess ($MAPPA_SANDBOX): agent code is not isolated")


def test_no_isolating_backend_is_said_once_with_the_command_that_fixes_it(monkeypatch, capsys):
    monkeypatch.delenv("MAPPA_SANDBOX", raising=False)
    monkeypatch.setattr("sandboxes.auto_choice", lambda **kw: ("subprocess", ["docker: no engine answers"]))
    choice = train_command.announce_sandbox(preset("smoke"))
    assert choice == {
        "backend": "subprocess",
        "isolated": False,
        "chosen_by": "auto",
        "passed_over": ["docker: no engine answers"],
    }
    out = capsys.readouterr().out
    assert "NOT ISOLATED" in out and "(docker: no engine answers)" in out and "`sudo make sandbox`" in out
    # mappa train then runs every env on that backend, and its config.json still says how it was picked
    monkeypatch.setenv("MAPPA_SANDBOX", "subprocess")
    monkeypatch.setenv("MAPPA_SANDBOX_RECORD", json.dumps(choice))
    assert config_record(preset("smoke"))["sandbox"] == choice


def test_a_finished_run_drops_its_checkpoints_once_every_role_is_exported(tmp_path):
    run = tmp_path / "run"
    state = run / "checkpoints" / "iter-00001" / "verifier"
    state.mkdir(parents=True)
    (state / "optim.pt").write_bytes(b"x" * 4096)
    (run / "checkpoints" / "latest").write_text("iter-00001")
    (run / "models" / "verifier").mkdir(parents=True)
    (run / "models" / "verifier" / "config.json").write_text("{}")
    lines: list[str] = []
    assert drop_finished_checkpoints(run, ["verifier", "problem_solver"], log=lines.append) == 0
    assert (run / "checkpoints" / "latest").exists() and "models/ lacks ['problem_solver']" in lines[-1]
    (run / "models" / "problem_solver").mkdir()
    (run / "models" / "problem_solver" / "adapter_config.json").write_text("{}")  # a LoRA role's export
    assert drop_finished_checkpoints(run, ["verifier", "problem_solver"], log=lines.append) == 4096 + len("iter-00001")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [REMOVED]
    assert "--keep-finished-checkpoints keeps them" in lines[-1]
    (run / "config.json").write_text(json.dumps(asdict(TrainConfig(out_dir=str(run)))))
    with pytest.raises(ValueError, match="checkpoints were removed when the run finished"):
        check_resumable(TrainConfig(out_dir=str(run)))  # no eval.json: it did not finish its evaluation
    (run / "eval.json").write_text("{}")
    with pytest.raises(FinishedRun, match="is this configuration's finished run: its trained models are in"):
        check_resumable(TrainConfig(out_dir=str(run)))  # the same command again: where its results are
    with pytest.raises(ValueError, match="checkpoints were removed when the run finished") as e:
        check_resumable(TrainConfig(out_dir=str(run), iterations=99))  # more iterations: cannot be extended
    assert not isinstance(e.value, FinishedRun)
