#!/usr/bin/env bash
# One prepared run that proves bertforge's CUDA paths on a GPU and measures them against transformers.
#
#   bash benchmarks/gpu_check.sh EXCERPT OUTDIR          on a machine with a CUDA GPU (about 6 minutes)
#   bash benchmarks/gpu_check.sh EXCERPT OUTDIR --dry    the same stages on the CPU at toy sizes (under a minute)
#
# EXCERPT comes from benchmarks/gpu_prepare.py.  Runs from the source tree (PYTHONPATH=src, python from
# $PYTHON, default python3), installs nothing, reaches no network, and writes only under OUTDIR (caches and
# temporary files included).  Stages, each time-boxed, none stopped by an earlier one's failure:
#
#   env         the machine: torch, CUDA, the GPU, package versions                       (OUTDIR/env.json)
#   tests       pytest -m cuda tests/train/test_cuda.py: bf16 against fp32, variable-length attention on the fused
#               kernels, attention dropout, torch.compile, a GPU checkpoint resumed on the CPU
#   bench_mini  bertforge bench --preset mini, batch 256 x 128 of the excerpt's text, against transformers,
#               and the same step under --compile against eager (does torch.compile pay on this GPU?)
#   bench_base  the same for --preset base
#   bench_modern_1k, bench_modern_8k  bertforge bench --arch modernbert --preset mini at 16 x 1,024 and 2 x 8,192
#               tokens of the excerpt's text against transformers' ModernBertForMaskedLM (bf16, tokens/s, MFU)
#   pretrain    bertforge pretrain --preset base --max-time 2m on the excerpt's books
#   squad       bertforge finetune squad from that model, about 100 steps; F1 reported
#
# OUTDIR/summary.json is rewritten after every stage (status passed/failed/skipped/timeout, seconds, figures,
# log path, log tail on failure), so a run cut short still reports what it did.  The whole run keeps within
# GPU_CHECK_BUDGET seconds (default 540; 120 with --dry): a stage gets what is left of it at the most.
# At the end the bulky outputs are deleted (weights over 10 MB, checkpoints, caches, temporary files: GBs for
# the base model, too much to bring back from a device run) unless GPU_CHECK_KEEP=1.
# Exit status: 0 when no stage failed or timed out, 1 otherwise, 2 on bad arguments.
set -u

usage() { echo "usage: bash benchmarks/gpu_check.sh EXCERPT OUTDIR [--dry]" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || usage
EXCERPT=$1
OUT=$2
DRY=0
if [ $# -eq 3 ]; then
  [ "$3" = --dry ] || { echo "error: unknown option $3 (expected --dry)" >&2; exit 2; }
  DRY=1
fi
for f in manifest.json gutenberg/train.jsonl gutenberg/validation.jsonl sst2/dev.tsv squad/train.json squad/dev.json tokenizer; do
  [ -e "$EXCERPT/$f" ] || { echo "error: $EXCERPT/$f not found; make the excerpt with benchmarks/gpu_prepare.py" >&2; exit 2; }
done
if [ -e "$OUT/summary.json" ]; then echo "error: $OUT already holds a check (summary.json); choose an empty folder" >&2; exit 2; fi
# the environment, the stage runner, the summary and the pruning, shared with gpu_seed001.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh" || exit 2
STAGES=(env tests bench_mini bench_base bench_modern_1k bench_modern_8k pretrain squad)
if [ $DRY = 1 ]; then MODE=dry BUDGET=${GPU_CHECK_BUDGET:-120}; else MODE=gpu BUDGET=${GPU_CHECK_BUDGET:-540}; fi
gpu_begin gpu_check GPU_CHECK_BUDGET "$BUDGET" "$MODE" "${STAGES[@]}"

env_stage 60 "${STAGES[@]:1}"

if [ $DRY = 1 ]; then
  DEV=cpu  # one thread: light on a shared machine, and no thread contention with other processes
  BENCH=(--batch-size 8 --seq-len 64 --steps 1 --rounds 1 --threads 1)
  PRETRAIN=(--preset tiny --max-seq-length 64 --batch-size 8 --max-time 3s --max-eval-instances 32 --threads 1)
  SQUAD=(--max-train-examples 16 --batch-size 8 --max-seq-length 128 --doc-stride 64 --eval-batch-size 16 --threads 1)
else
  DEV=cuda
  BENCH=(--batch-size 256 --seq-len 128 --steps 3 --rounds 5)
  PRETRAIN=(--preset base --max-seq-length 128 --batch-size 256 --max-time 2m --max-eval-instances 1024)
  SQUAD=(--max-train-examples 3200 --batch-size 32 --max-seq-length 384 --lr 1e-4)
fi

# a: the CUDA tests (on the CPU they all skip: the stage then checks that they still import and collect)
stage tests 200 env BERTFORGE_CUDA_REPORT="$OUT/tests/figures.jsonl" "$PY" -m pytest -q -p no:cacheprovider -rA \
  --durations=0 -m cuda tests/train/test_cuda.py --junitxml "$OUT/tests/junit.xml" --basetemp "$OUT/tests/tmp"

# b: bertforge against transformers, bf16 autocast + SDPA + fused AdamW on both sides, neither compiled
bench() {
  local name=$1 limit=$2 preset=$3
  shift 3
  stage "bench_$name" "$limit" "$PY" -m bertforge bench --preset "$preset" "${BENCH[@]}" --device $DEV \
    --data-dir "$EXCERPT" --text "$EXCERPT/gutenberg/train.jsonl" --tokenizer "$EXCERPT/tokenizer" "$@"
}
if [ $DRY = 1 ]; then
  bench mini 90 tiny
  summary skip "$OUT" bench_base "dry run: the base preset is measured on the GPU only (bench_mini ran the tiny one)"
  for s in bench_modern_1k bench_modern_8k; do
    summary skip "$OUT" $s "dry run: ModernBERT's long sequences are measured on the GPU only"
  done
else
  bench mini 150 mini --compile
  bench base 120 base
  # the modern arm: long sequences, where the local layers' banded attention counts (training only)
  BENCH=(--steps 3 --rounds 3)
  bench modern_1k 90 mini --arch modernbert --batch-size 16 --seq-len 1024
  bench modern_8k 90 mini --arch modernbert --batch-size 2 --seq-len 8192
fi

# c: a short real pretraining run of the excerpt's books
stage pretrain 200 "$PY" -m bertforge pretrain --data "$EXCERPT/gutenberg/train.jsonl" \
  --eval-data "$EXCERPT/gutenberg/validation.jsonl" --tokenizer "$EXCERPT/tokenizer" --out "$OUT/pretrain" \
  "${PRETRAIN[@]}" --eval-every 0 --save-every 0 --log-every 10 --device $DEV --cache-dir "$OUT/cache" --no-progress
[ "${GPU_CHECK_KEEP:-0}" = 1 ] || rm -rf "$OUT/pretrain/checkpoints"  # 1.3 GB for base; squad needs only the model

# d: SQuAD fine-tuning of that model for about 100 steps (one epoch of the first N questions)
if [ -f "$OUT/pretrain/config.json" ] && [ -f "$OUT/pretrain/model.safetensors" ]; then
  stage squad 150 "$PY" -m bertforge finetune squad --model "$OUT/pretrain" --train "$EXCERPT/squad/train.json" \
    --validation "$EXCERPT/squad/dev.json" --out "$OUT/squad" "${SQUAD[@]}" --epochs 1 --device $DEV --no-progress
else
  summary skip "$OUT" squad "no model to fine-tune: the pretrain stage wrote none"
fi

summary done "$OUT"
