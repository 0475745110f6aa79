"""Descriptive figures of the test's runs (not tested): per seed, each iteration's training-episode valid rate and
time, the training tasks with valid submissions in iterations 4-6, and each role's held-out code rate / tool
success before and after (from `mappa train`'s own files).

.venv/bin/python docs/runs/dsbench-test2/describe.py docs/runs/dsbench-test2/seed-2 docs/runs/dsbench-test2/seed-3 ...
"""

import collections
import json
import sys
from pathlib import Path

ROLES = ("data_engineer", "modeler", "analyst")


def main(folders: list[str]) -> None:
    for folder in folders:
        rows = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines() if line]
        ev = json.loads((Path(folder) / "eval.json").read_text())
        print(folder)
        print("  training episodes valid per iteration:", ", ".join(f"{r['accuracy']:.2f}" for r in rows))
        print("  iteration seconds:", ", ".join(f"{r['iteration_s']:.0f}" for r in rows))
        late: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for f in sorted((Path(folder) / "rollouts").glob("iter-*.jsonl"))[3:]:
            for line in f.read_text().splitlines():
                ep = json.loads(line)["episode"]
                late[ep["task_id"]][0] += bool(ep["outcome"]["valid"])
                late[ep["task_id"]][1] += 1
        print(
            "  training tasks, valid in iterations 4-6:",
            ", ".join(f"{t} {k}/{n}" for t, (k, n) in sorted(late.items())),
        )
        for role in ROLES:
            b, a = ev["before"]["behaviour"][role], ev["after"]["behaviour"][role]
            print(
                f"  held-out {role}: code rate / tool success {b['code_rate']:.0%} / {b['tool_success_rate']:.0%}"
                f" -> {a['code_rate']:.0%} / {a['tool_success_rate']:.0%}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
