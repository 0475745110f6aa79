"""The ``mappa`` command line.

mappa env list                               list registered environments
mappa run --env mappa/MathChat-v0 -n 3       run episodes with local models, write trajectories, print stats
mappa presets                                the named training configurations, one line each
mappa train --preset demo                    train every role (REINFORCE++ / GRPO / outcome-only)
mappa train --config runs/demo/config.json   the same from a configuration file (JSON or YAML; flags override)
mappa eval -k 1                              evaluate a team on AIME-32, AMC-32 and DSBench eval, with intervals
mappa eval --run RUN --tasks F --compare     a run's team vs the bundled one on a task file: paired exact test
mappa report run RUN [RUN ...]               a report (Markdown + PNG, HTML) of training runs
mappa ablate --preset smoke --seeds 0,1,2   coach vs outcome-only vs GRPO, every seed, one budget, then the reports
mappa report ablation OUT                    an ablation pooled over seeds and problems (intervals, Holm p-values)
mappa bench                                  the speed and memory suite, every figure beside a reference (not the
                                             mappa-bench-v2 benchmark: that is mappa eval --protocol)
mappa report coach-bias TRAJECTORIES         coach scores by role, task type and outcome
mappa rescore RUN --coach SPEC --out DIR     re-score a run's stored episodes with another coach (resumable)
mappa sandbox build|reap|serve|check         the sandbox image and service, which backends run here
mappa env serve ENV_ID [--seat ROLE]         an env served over OpenEnv (WebSocket sessions; the openenv extra)
"""

from __future__ import annotations

import argparse
import sys

from baselines.planning.presets import preset_lines
from benchmarks.suite import main as bench_main
from sandboxes.__main__ import main as sandboxes_main

from .commands import ablate, evaluate, report, rescore, run, serve, train
from .commands.common import use_ray_address


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mappa", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train.add_parser(sub)
    presets = sub.add_parser("presets", help="the named training configurations (--preset), one line each")
    presets.set_defaults(func=_cmd_presets)
    report.add_parser(sub)
    ablate.add_parser(sub)
    sub.add_parser(
        "bench",
        help="the speed and memory suite, every figure beside a reference (mappa bench -h); the mappa-bench-v2 "
        "benchmark is mappa eval --protocol",
    )
    sub.add_parser("sandbox", help="build the Docker sandbox image offline, or reap leftovers (mappa sandbox -h)")
    evaluate.add_parser(sub)
    rescore.add_parser(sub)
    run.add_parsers(sub)
    serve.add_parser(sub)
    return parser


def _cmd_presets(args: argparse.Namespace) -> int:
    print(preset_lines())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the benchmark suite's own parser
        return bench_main(argv[1:])
    if argv[:1] == ["sandbox"]:  # its own parser, so that `mappa sandbox -h` shows its help
        return sandboxes_main(argv[1:], prog="mappa sandbox")
    args = build_parser().parse_args(argv)
    use_ray_address(getattr(args, "ray_address", None))  # before the command imports Ray or starts child processes
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
