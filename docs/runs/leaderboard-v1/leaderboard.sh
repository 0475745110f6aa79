#!/bin/bash
# issue 19: the mathchat-cpu leaderboard of mappa-bench-v1, seed 1 (the session-11 ablation's arms + RLOO + the base team)
set -x
cd /tmp/lb
export PYTHONPATH=/tmp/lb
M=/tmp/lb/.venv/bin/mappa
ABL=/tmp/abl/runs/ablation-demo-s11
OUT=/tmp/lb/runs/leaderboard
mkdir -p $OUT
date
/tmp/lb/.venv/bin/pip install -q --no-deps /tmp/lb/tests/plugins/mappa_rloo
# 1. RLOO at demo scale, seed 1 (same preset, pool, budget as the session-11 ablation's arms)
$M ablate --preset demo --seed 1 --estimators rloo --out $ABL > $OUT/rloo-train.log 2>&1
date
# 2. protocol evaluations: the base team, then every arm's exported models
$M eval --protocol mappa-bench-v1 --track mathchat-cpu --method base-smollm2-135m --seed 1 --out $OUT/base > $OUT/base.log 2>&1
for arm in coach outcome grpo rloo; do
  $M eval --protocol mappa-bench-v1 --track mathchat-cpu --run $ABL/$arm --method $arm --out $OUT/$arm > $OUT/$arm.log 2>&1
  date
done
$M report compare $OUT/*/result.json --out $OUT/compare > $OUT/compare.log 2>&1
/tmp/lb/.venv/bin/pip uninstall -y -q mappa-rloo
date
echo DONE
