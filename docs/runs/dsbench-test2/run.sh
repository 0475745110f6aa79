#!/usr/bin/env bash
# the second pre-registered DSBench level-0 test (docs/preregistration/dsbench-level0-second.md): seeds 2, 3, 4 one
# after the other; a run that dies is started once more with the same command (it resumes from its last checkpoint)
cd /work/main
mkdir -p runs/dsbench-test2
for S in 2 3 4; do
  for TRY in 1 2; do
    RAY_USAGE_STATS_ENABLED=0 .venv/bin/mappa train --preset demo-dsbench --iterations 6 --eval-samples 8 --seed $S \
      --out runs/dsbench-test2/seed-$S --no-progress > runs/dsbench-test2/console-seed-$S-try-$TRY.txt 2>&1
    RC=$?
    echo "EXIT $RC" >> runs/dsbench-test2/console-seed-$S-try-$TRY.txt
    [ $RC -eq 0 ] && break
  done
  rm -rf runs/dsbench-test2/seed-$S/checkpoints
done
echo ALLDONE > runs/dsbench-test2/done
