#!/bin/bash
# after (HEAD, one pool) then before (fe6850f, one process per run); alone on the machine
set -x
cd /work/main
git rev-parse HEAD > /work/timing/after.commit
/usr/bin/time -v ./.venv/bin/mappa ablate --preset smoke --seeds 0,1,2 --arms coach,outcome,grpo,hindsight --no-resume --out runs/ablation-pool-after > /work/timing/after.console 2>&1
echo "after rc=$?" >> /work/timing/ba.status
cd /work/wt-before
PYTHONPATH=/work/wt-before /usr/bin/time -v /work/main/.venv/bin/python -m benchmarks.cli ablate --preset smoke --seeds 0,1,2 --arms coach,outcome,grpo,hindsight --no-resume --out /work/main/runs/ablation-pool-before > /work/timing/before.console 2>&1
echo "before rc=$?" >> /work/timing/ba.status
