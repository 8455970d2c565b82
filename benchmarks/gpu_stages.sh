# shellcheck shell=bash
# What benchmarks/gpu_check.sh and benchmarks/gpu_seed001.sh share; sourced by them, not run on its own.
#
#   gpu_begin SCRIPT BUDGET_VAR BUDGET MODE STAGE...   once EXCERPT and OUT are checked: OUT's folders, the
#                                                      environment (every cache and temporary file under OUT),
#                                                      the deadline, OUT/summary.json ("STAGE" or "STAGE=LIMIT")
#   stage NAME LIMIT COMMAND...                        COMMAND time-boxed, its outcome in the summary
#   summary ARGS...                                    benchmarks/gpu_summary.py ARGS
#
# Sets ROOT, PY (from $PYTHON, default python3), EXCERPT and OUT as absolute paths, and the working directory to
# ROOT.  On exit the bulky outputs are deleted (prune) unless GPU_CHECK_KEEP=1.

summary() { "$PY" benchmarks/gpu_summary.py "$@"; }

gpu_begin() {
  SCRIPT=$1 BUDGET_VAR=$2 BUDGET=$3 MODE=$4
  shift 4
  mkdir -p "$OUT/logs" "$OUT/tests" "$OUT/cache" "$OUT/tmp" || { echo "error: cannot create $OUT" >&2; exit 2; }
  EXCERPT=$(cd "$EXCERPT" && pwd)
  OUT=$(cd "$OUT" && pwd)
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cd "$ROOT" || exit 2
  PY=${PYTHON:-python3}
  export PYTHONPATH="$ROOT/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
  export BERTFORGE_CACHE="$OUT/cache" TMPDIR="$OUT/tmp" XDG_CACHE_HOME="$OUT/cache" MPLCONFIGDIR="$OUT/cache/matplotlib"
  export TORCHINDUCTOR_CACHE_DIR="$OUT/cache/inductor" TRITON_CACHE_DIR="$OUT/cache/triton" CUDA_CACHE_PATH="$OUT/cache/nv"
  export HF_HOME="$OUT/cache/huggingface" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
  DEADLINE=$(( $(date +%s) + BUDGET ))
  summary init "$OUT" --script "$SCRIPT" --mode "$MODE" --excerpt "$EXCERPT" --budget "$BUDGET" "$@" || exit 2
  trap prune EXIT
}

# stage NAME LIMIT COMMAND...: run COMMAND time-boxed to LIMIT seconds (less if the budget is nearly spent),
# its output in OUT/logs/NAME.log, and record the outcome in the summary.
stage() {
  local name=$1 limit=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) - 5 ))
  if [ "$left" -lt 10 ]; then
    summary skip "$OUT" "$name" "the run's time budget ($BUDGET_VAR=${BUDGET}s) was spent"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  summary start "$OUT" "$name" "$limit" -- "$@"
  local t0 t1 rc
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  summary finish "$OUT" "$name" --rc "$rc" --seconds "$(( (t1 - t0) / 1000000 ))e-3"
}

# prune: delete what is too bulky to bring back (kept with GPU_CHECK_KEEP=1); runs on every exit
prune() {
  [ "${GPU_CHECK_KEEP:-0}" = 1 ] && return
  rm -rf "$OUT/pretrain/checkpoints" "$OUT/squad/checkpoints" "$OUT/cache" "$OUT/tmp" "$OUT/tests/tmp"
  find "$OUT" -name '*.safetensors' -size +10M -delete 2>/dev/null
}

# env_stage LIMIT STAGE...: the env stage; without a CUDA GPU (and not --dry) the other STAGEs are skipped,
# the summary closed and the script ends here with its status.
env_stage() {
  local limit=$1
  shift
  stage env "$limit" "$PY" benchmarks/gpu_summary.py env "$OUT"
  grep -q '"cuda_available": true' "$OUT/env.json" 2>/dev/null && return
  [ "$DRY" = 1 ] && return
  local s
  for s in "$@"; do
    summary skip "$OUT" "$s" "no CUDA GPU: torch.cuda.is_available() is false (see env); use --dry for a CPU run"
  done
  summary done "$OUT"
  exit $?
}
