"""Medians of benchmarks/bench_pair.sh's runs: tokens/s and the ratio against transformers, before and after.

    python benchmarks/bench_pair_summary.py OUTDIR
"""

import glob
import json
import statistics
import sys

d = sys.argv[1]
def last_json(p):
    for line in reversed(open(p).read().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
rows = {}
for kind, key, ratio in (("pre", "train_tokens_per_second", "train_speedup_vs_transformers"),
                         ("cls", "finetune_tokens_per_second", "finetune_speedup_vs_transformers")):
    for side in ("old", "new"):
        vals = [last_json(p) for p in sorted(glob.glob(f"{d}/{kind}-{side}-*.txt"))]
        vals = [v for v in vals if v]
        rows[(kind, side)] = ([v[key] for v in vals], [v[ratio] for v in vals])
for kind in ("pre", "cls"):
    o, n = rows[(kind, "old")], rows[(kind, "new")]
    print(kind, "tok/s old", [round(x) for x in o[0]], "new", [round(x) for x in n[0]])
    print(kind, "ratio old", [round(x, 2) for x in o[1]], "new", [round(x, 2) for x in n[1]])
    if o[0] and n[0]:
        mo, mn = statistics.median(o[0]), statistics.median(n[0])
        print(f"{kind}: median tok/s old {mo:.0f} new {mn:.0f} new/old {mn / mo:.3f}; median ratio vs transformers "
              f"old {statistics.median(o[1]):.2f} new {statistics.median(n[1]):.2f}; "
              f"per-round new/old {[round(b / a, 3) for a, b in zip(o[0], n[0])]}")
