#!/bin/bash
# issue 19: the protocol evaluations (the second half of leaderboard.sh, run once the RLOO arm had trained)
set -x
cd /tmp/lb
export PYTHONPATH=/tmp/lb
M=/tmp/lb/.venv/bin/mappa
ABL=/tmp/abl/runs/ablation-demo-s11
OUT=/tmp/lb/runs/leaderboard
date
# base done earlier
for arm in coach outcome grpo rloo; do
  $M eval --protocol mappa-bench-v1 --track mathchat-cpu --run $ABL/$arm --method $arm --out $OUT/$arm > $OUT/$arm.log 2>&1
  date
done
$M report compare $OUT/*/result.json --out $OUT/compare > $OUT/compare.log 2>&1
date
echo DONE
