"""The pre-registered analysis (docs/preregistration/dsbench-level0.md) of the two runs' eval.json files.

.venv/bin/python docs/runs/dsbench-test/analyze.py docs/runs/dsbench-test/seed-0 docs/runs/dsbench-test/seed-1
"""

import json
import sys
from pathlib import Path

from mappa_envs.metrics import mcnemar_exact, paired_change, wilson_interval


def units(ev: dict) -> dict[str, float]:
    """Each task's mean valid rate over its samples."""
    sums: dict[str, list[int]] = {}
    for tid, ok in zip(ev["task_ids"], ev["outcomes"], strict=True):
        sums.setdefault(tid, [0, 0])
        sums[tid][0] += int(ok)
        sums[tid][1] += 1
    return {t: s / n for t, (s, n) in sums.items()}


def main(folders: list[str]) -> None:
    unit_b, unit_a, ep_b, ep_a = [], [], [], []
    for folder in folders:
        d = json.loads((Path(folder) / "eval.json").read_text())
        b, a = d["before"], d["after"]
        assert b["task_ids"] == a["task_ids"], "not the same episodes"
        ub, ua = units(b), units(a)
        print(
            f"{folder}: valid {b['correct']}/{b['episodes']} -> {a['correct']}/{a['episodes']}; "
            f"mean quality {b['mean_quality']:.3f} -> {a['mean_quality']:.3f}"
        )
        for t in ub:
            print(f"  {t}: {ub[t]:.3f} -> {ua[t]:.3f}")
        print("  its own paired_change (tasks as units):", json.dumps(paired_change(b, a)))
        unit_b += [ub[t] for t in ub]
        unit_a += [ua[t] for t in ub]
        ep_b += b["outcomes"]
        ep_a += a["outcomes"]
    primary = mcnemar_exact(unit_b, unit_a)
    print("PRIMARY: exact sign test over (seed, task) units:", json.dumps(primary))
    print("  a gain is claimed if p < 0.05:", primary["p_value"] < 0.05 and primary["gained"] > primary["lost"])
    episode = mcnemar_exact(ep_b, ep_a)
    nb, na = sum(ep_b), sum(ep_a)
    print(
        f"secondary, descriptive: pooled valid {nb}/{len(ep_b)} {wilson_interval(nb, len(ep_b))} -> "
        f"{na}/{len(ep_a)} {wilson_interval(na, len(ep_a))}"
    )
    print("  episode-level exact McNemar (samples not independent: optimistic):", json.dumps(episode))


if __name__ == "__main__":
    main(sys.argv[1:])
