#!/usr/bin/env bash
# the pre-registered test (docs/preregistration/dsbench-level0.md), seeds 0 then 1, at commit 1c21f3f
cd /work/main
for S in 0 1; do
  RAY_USAGE_STATS_ENABLED=0 .venv/bin/mappa train --preset demo-dsbench --iterations 4 --eval-samples 8 --seed $S \
    --out runs/dsbench-test/seed-$S --no-progress > runs/dsbench-test/console-seed-$S.txt 2>&1
  echo "EXIT $?" >> runs/dsbench-test/console-seed-$S.txt
  rm -rf runs/dsbench-test/seed-$S/checkpoints
done
echo ALLDONE > runs/dsbench-test/done
