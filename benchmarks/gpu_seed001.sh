#!/usr/bin/env bash
# The seed result at its own scale, as one prepared run on a GPU: a mini BERT (4 layers, hidden 256, 4 heads,
# the 30,522-token bert-base-uncased WordPiece vocabulary) pretrained from scratch on the excerpt's books, then
# fine-tuned on the whole SQuAD v1.1 training set.  The seed run (two T4s, within a day: ~200 M tokens of
# short stories, then the 87,599 questions) scored exact match 12.64, F1 about 20.
#
#   bash benchmarks/gpu_seed001.sh EXCERPT OUTDIR [--dev FILE]         on a machine with a CUDA GPU (under 9 min)
#   bash benchmarks/gpu_seed001.sh EXCERPT OUTDIR --dry [--dev FILE]   the same stages on the CPU at toy sizes
#   bash benchmarks/gpu_seed001.sh --budgets                           the GPU run's stage limits, as JSON
#
# EXCERPT comes from benchmarks/gpu_prepare.py (the same excerpt as gpu_check.sh's; run that check first).
# Runs from the source tree, installs nothing, reaches no network, writes only under OUTDIR.  Stages, each
# time-boxed, none stopped by an earlier one's failure:
#
#   env        the machine (OUTDIR/env.json)
#   matmul     the bf16 matmul peak of this GPU, measured: one of the two things MFU is measured against
#   pretrain   bertforge pretrain --preset mini, the budget recipe, bf16 autocast, batch 256 x 128, for
#              PRETRAIN_SECONDS of training on gutenberg/books.jsonl.gz (epochs over the text are counted),
#              held-out evaluation on gutenberg/held-out.jsonl.gz
#   mlm        bertforge evaluate mlm of that model on the held-out books (the fixed protocol)
#   squad      bertforge finetune squad on squad/train-v1.1.json.gz, 2 epochs, without validation: the CPU
#              chain's recipe (benchmarks/seed001_cpu.py: length 128, stride 32, batch 32), no dev read
#   squad_dev  bertforge evaluate squad of the fine-tuned model on squad/dev-v1.1.json (1,032 of the official
#              10,570 questions), or on --dev FILE, a larger dev file; answers of at most 8 tokens, as the
#              CPU chain scores them (chosen on set-aside training articles, never dev)
#
# Pretraining and fine-tuning run under benchmarks/gpu_summary.py's `timed`: the seconds spent tokenizing,
# building SQuAD's features and building batches (the GPU waiting for data) go into the summary, beside
# tokens seen, tokens/s, and MFU against the GPU's bf16 dense peak (data sheet) and against the matmul stage.
# OUTDIR/summary.json is rewritten after every stage; the run keeps within GPU_SEED_BUDGET seconds (at most
# 540; the stage limits add up to it at most); bulky outputs are deleted at the end unless GPU_CHECK_KEEP=1.
# Exit status: 0 when no stage failed or timed out, 1 otherwise, 2 on bad arguments.
set -u

STAGES=(env matmul pretrain mlm squad squad_dev)
declare -A GPU_LIMIT=([env]=25 [matmul]=20 [pretrain]=215 [mlm]=25 [squad]=210 [squad_dev]=25)
declare -A DRY_LIMIT=([env]=30 [matmul]=20 [pretrain]=45 [mlm]=25 [squad]=40 [squad_dev]=20)  # a loaded CPU
GPU_BUDGET=525     # the limits' sum; 15 s of the 540 left for a killed stage's grace period and the summary
DRY_BUDGET=180
PRETRAIN_SECONDS=130  # the training clock's share of the budget: tokenizing, evaluation and saving come on top
MAX_BUDGET=540

if [ $# -eq 1 ] && [ "$1" = --budgets ]; then
  printf '{"budget": %d, "max_budget": %d, "pretrain_seconds": %d, "stages": {' "$GPU_BUDGET" "$MAX_BUDGET" "$PRETRAIN_SECONDS"
  sep=""
  for s in "${STAGES[@]}"; do printf '%s"%s": %d' "$sep" "$s" "${GPU_LIMIT[$s]}"; sep=", "; done
  printf '}}\n'
  exit 0
fi

usage() { echo "usage: bash benchmarks/gpu_seed001.sh EXCERPT OUTDIR [--dry] [--dev FILE] | --budgets" >&2; exit 2; }
[ $# -ge 2 ] || usage
EXCERPT=$1
OUT=$2
shift 2
DRY=0
DEV=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry) DRY=1 ;;
    --dev) [ $# -ge 2 ] || usage; DEV=$2; shift
           [ -f "$DEV" ] || { echo "error: --dev $DEV: no such file" >&2; exit 2; }
           DEV=$(cd "$(dirname "$DEV")" && pwd)/$(basename "$DEV") ;;
    *) echo "error: unknown option $1 (expected --dry or --dev FILE)" >&2; exit 2 ;;
  esac
  shift
done
for f in manifest.json gutenberg/books.jsonl.gz gutenberg/held-out.jsonl.gz squad/train-v1.1.json.gz \
         squad/dev-v1.1.json tokenizer; do
  [ -e "$EXCERPT/$f" ] || { echo "error: $EXCERPT/$f not found; make the excerpt with benchmarks/gpu_prepare.py" >&2; exit 2; }
done
if [ -e "$OUT/summary.json" ]; then echo "error: $OUT already holds a run (summary.json); choose an empty folder" >&2; exit 2; fi

# the environment, the stage runner, the summary and the pruning, shared with gpu_check.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh" || exit 2
if [ $DRY = 1 ]; then
  MODE=dry BUDGET=${GPU_SEED_BUDGET:-$DRY_BUDGET}
  declare -n LIMIT=DRY_LIMIT
else
  MODE=gpu BUDGET=${GPU_SEED_BUDGET:-$GPU_BUDGET}
  declare -n LIMIT=GPU_LIMIT
fi
[ "$BUDGET" -le "$MAX_BUDGET" ] 2>/dev/null || { echo "error: GPU_SEED_BUDGET=$BUDGET: at most $MAX_BUDGET s" >&2; exit 2; }
PLAN=()
for s in "${STAGES[@]}"; do PLAN+=("$s=${LIMIT[$s]}"); done
gpu_begin gpu_seed001 GPU_SEED_BUDGET "$BUDGET" "$MODE" "${PLAN[@]}"

env_stage "${LIMIT[env]}" "${STAGES[@]:1}"

if [ $DRY = 1 ]; then
  DEVICE=(--device cpu --threads 1)  # one thread: light on a shared machine
  MATMUL=(--dtype fp32 --seconds 0.1)
  PRETRAIN=(--preset tiny --max-seq-length 64 --batch-size 8 --max-time 2s --max-eval-instances 32 --log-every 5)
  MLM=(--batch-size 32 --max-blocks 64)
  SQUAD=(--max-train-examples 32 --batch-size 8 --max-seq-length 128 --doc-stride 32)
  EVAL=(--batch-size 16 --max-seq-length 128 --doc-stride 32 --max-answer-length 8)
else
  DEVICE=(--device cuda)
  MATMUL=(--dtype bf16)
  PRETRAIN=(--preset mini --max-seq-length 128 --batch-size 256 --max-time "${PRETRAIN_SECONDS}s" --precision bf16
            --max-eval-instances 2048 --log-every 100)
  MLM=(--batch-size 256)
  SQUAD=(--batch-size 32 --max-seq-length 128 --doc-stride 32 --precision bf16)
  EVAL=(--batch-size 256 --max-seq-length 128 --doc-stride 32 --max-answer-length 8)
fi
BF=("$PY" benchmarks/gpu_summary.py timed "$OUT")  # bertforge, with its time on the CPU measured

stage matmul "${LIMIT[matmul]}" "$PY" benchmarks/gpu_summary.py matmul "$OUT" "${MATMUL[@]}"

# a: pretraining from scratch: the budget recipe (masked LM only, 30% masked, lr 1e-3, ...), no NSP
stage pretrain "${LIMIT[pretrain]}" "${BF[@]}" pretrain -- pretrain --data "$EXCERPT/gutenberg/books.jsonl.gz" \
  --eval-data "$EXCERPT/gutenberg/held-out.jsonl.gz" --tokenizer "$EXCERPT/tokenizer" --out "$OUT/pretrain" \
  "${PRETRAIN[@]}" --eval-every 0 --save-every 0 --cache-dir "$OUT/cache" --no-progress "${DEVICE[@]}"
[ "${GPU_CHECK_KEEP:-0}" = 1 ] || rm -rf "$OUT/pretrain/checkpoints"  # the next stages need only the model

# b: held-out masked-LM accuracy, the fixed protocol of `bertforge evaluate mlm`
if [ -f "$OUT/pretrain/model.safetensors" ]; then
  stage mlm "${LIMIT[mlm]}" "$PY" -m bertforge evaluate mlm --model "$OUT/pretrain" \
    --data "$EXCERPT/gutenberg/held-out.jsonl.gz" --max-seq-length 128 "${MLM[@]}" "${DEVICE[@]:0:2}"
else
  summary skip "$OUT" mlm "no model to evaluate: the pretrain stage wrote none"
fi

# c: SQuAD v1.1 fine-tuning on the whole training set, 2 epochs, without validation (dev is read only by d)
if [ -f "$OUT/pretrain/config.json" ] && [ -f "$OUT/pretrain/model.safetensors" ]; then
  stage squad "${LIMIT[squad]}" "${BF[@]}" squad -- finetune squad --model "$OUT/pretrain" \
    --train "$EXCERPT/squad/train-v1.1.json.gz" --out "$OUT/squad" "${SQUAD[@]}" --epochs 2 --no-progress \
    "${DEVICE[@]}"
else
  summary skip "$OUT" squad "no model to fine-tune: the pretrain stage wrote none"
fi

# d: the fine-tuned model on the dev questions (the excerpt's, or a larger file given by --dev)
if [ -f "$OUT/squad/model.safetensors" ]; then
  stage squad_dev "${LIMIT[squad_dev]}" "$PY" -m bertforge evaluate squad --model "$OUT/squad" \
    --data "${DEV:-$EXCERPT/squad/dev-v1.1.json}" "${EVAL[@]}" "${DEVICE[@]:0:2}"
else
  summary skip "$OUT" squad_dev "no fine-tuned model: the squad stage wrote none"
fi

summary done "$OUT"
