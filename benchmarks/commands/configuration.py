"""Where ``mappa train``'s (and ``mappa ablate``'s) configuration comes from: a preset, a configuration file (JSON
or YAML; a run's own ``config.json`` reproduces it), the options over them; what is said when neither is given; and
the sandbox line that opens a run's console."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from baselines.config import TrainConfig, sandbox_choice
from baselines.fields import read_mapping, values_from_mapping
from baselines.planning.presets import PRESETS, preset, preset_lines
from sandboxes import SETUP_COMMAND


def add_configuration_options(parser: argparse.ArgumentParser, whose: str) -> None:
    """``--preset NAME`` and ``--config FILE``, where ``whose`` configuration they give (``mappa train``: the run's;
    ``mappa ablate``: every arm's)."""
    parser.add_argument(
        "--preset",
        default=None,
        choices=list(PRESETS),
        metavar="NAME",
        help=f"{whose} named configuration: " + ", ".join(PRESETS) + " (`mappa presets` says what each is)",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"{whose} configuration file, JSON or YAML, of field names and values (a run's own config.json "
        "reproduces it); over --preset's values where both are given; each option given replaces one of its fields",
    )


RECORDED = ("reward_information", "numerics", "sandbox", "code_version")
"""What a run's ``config.json`` records beside the configuration's fields (:func:`baselines.config.config_record`):
read back by ``--config``, not fields."""


def base_config(preset_name: str | None, config_file: str | None):
    """The configuration ``--preset`` and ``--config`` give before the options: the preset's, then the file's
    fields over it (a file alone: over the fields' defaults). ``ValueError`` for an unreadable file, an unknown key
    or a value of the wrong type."""
    base = preset(preset_name) if preset_name else TrainConfig()
    if config_file:
        data = read_mapping(config_file)
        base = dataclasses.replace(base, **values_from_mapping(TrainConfig, data, ignore=RECORDED, what=config_file))
    return base


def source(args: argparse.Namespace) -> str:
    """Where the configuration came from: ``preset demo``, ``config runs/demo/config.json``, or both."""
    parts = [f"preset {args.preset}"] * bool(args.preset) + [f"config {args.config}"] * bool(
        getattr(args, "config", None)
    )
    return ", then ".join(parts)


def no_configuration(prog: str) -> int:
    """What ``mappa train`` (or ``mappa ablate``) without a preset or a configuration file says: what to pass,
    with the presets listed; exit status 2, nothing started."""
    print(
        f"{prog}: give a preset (--preset NAME) or a configuration file (--config FILE); nothing was started.\n"
        f"presets:\n{preset_lines()}\n"
        f"for example: {prog} --preset smoke   (the whole stack in a few minutes)\n"
        f"             {prog} --config runs/demo/config.json --out runs/again   (a run's own configuration)",
        file=sys.stderr,
    )
    return 2


def announce_sandbox(cfg) -> dict[str, Any]:
    """Print where the run's agent code executes (the first line of ``mappa train``'s console; the same record goes
    to ``config.json``): the backend, and where it does not isolate, why and the one command that fixes it."""
    choice = sandbox_choice(cfg)
    how = {"auto": "auto: the most isolating backend that works here"}.get(choice["chosen_by"], choice["chosen_by"])
    if choice["isolated"]:
        print(f"sandbox: {choice['backend']} ({how}): agent code runs isolated", flush=True)
    elif choice["chosen_by"] == "auto":
        why = "; ".join(choice["passed_over"])
        print(
            f"sandbox: subprocess - NOT ISOLATED. No isolating backend works here ({why}): agent code runs as your "
            f"user, with your files, network and processes in reach. `{SETUP_COMMAND}` sets up bubblewrap and Docker "
            "(root and apt).",
            flush=True,
        )
    else:
        print(f"sandbox: {choice['backend']} ({how}): agent code is not isolated", flush=True)
    return choice
