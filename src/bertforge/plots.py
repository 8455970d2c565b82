"""PNG plots of a training run, drawn from its ``metrics.jsonl`` (matplotlib, no display needed)."""

from __future__ import annotations

import os

from .logs import parse_lines


def read_metrics(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_lines(f)


def _series(rows: list[dict], kind: str, key: str, x: str = "step") -> tuple[list, list]:
    pts = [(r[x], r[key]) for r in rows if r.get("type") == kind and r.get(key) is not None and x in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def _figure(panels: list[tuple[str, list[tuple[str, str, str]]]], rows: list[dict], path: str, title: str,
            x: str) -> str | None:
    """One PNG with a panel per (panel title, [(kind, key, label)...]); empty panels are left out."""
    panels = [(t, lines) for t, lines in panels if any(_series(rows, k, key, x)[0] for k, key, _ in lines)]
    if not panels:
        return None
    # matplotlib is imported here, when a run ends, not with the command (a third of a second per process); a
    # Figure of its own draws with Agg, whatever backend the user's matplotlib is set to, and needs no pyplot
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2 * len(panels), 3.8))
    # fixed margins that fit the titles and tick labels: tight_layout measures them by drawing the figure once
    # more, half again the time of the whole plot, and every run draws three
    fig.subplots_adjust(left=0.8 / (5.2 * len(panels)), right=0.98, bottom=0.13, top=0.83, wspace=0.28)
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (ptitle, lines) in zip(axes[0], panels):
        for kind, key, label in lines:
            xs, ys = _series(rows, kind, key, x)
            if xs:
                style = "-" if kind == "train" else "o-"
                ax.plot(xs, ys, style, label=label, markersize=3, linewidth=1.4)
        ax.set_title(ptitle)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return path


def plot_pretraining(metrics_path: str, out_dir: str) -> list[str]:
    """loss.png (training and evaluation losses), accuracy.png (MLM/NSP accuracy), lr.png."""
    return _plots(metrics_path, out_dir, [
        ("loss.png", "Pretraining loss", [
            ("MLM loss", [("train", "mlm_loss", "train"), ("eval", "mlm_loss", "held-out")]),
            ("NSP loss", [("train", "nsp_loss", "train"), ("eval", "nsp_loss", "held-out")]),
            ("ELECTRA discriminator loss", [("train", "disc_loss", "train"), ("eval", "disc_loss", "held-out")]),
        ]),
        ("accuracy.png", "Pretraining accuracy", [
            ("MLM accuracy (selected tokens)", [("eval", "mlm_accuracy", "all selected"),
                                                ("eval", "mlm_accuracy_masked", "[MASK] only"),
                                                ("eval", "mlm_baseline_accuracy", "most frequent token")]),
            ("NSP accuracy", [("eval", "nsp_accuracy", "held-out")]),
            ("ELECTRA discriminator accuracy", [("eval", "disc_accuracy_replaced", "replaced tokens"),
                                                ("eval", "disc_accuracy_original", "original tokens"),
                                                ("eval", "replaced_fraction", "fraction replaced")]),
        ]),
    ])


def plot_finetuning(metrics_path: str, out_dir: str, metric_keys: list[tuple[str, str]]) -> list[str]:
    """loss.png (training loss, validation loss) and metrics.png (``metric_keys``: (key, label)), lr.png."""
    return _plots(metrics_path, out_dir, [
        ("loss.png", "Fine-tuning loss", [("loss", [("train", "loss", "train"), ("eval", "loss", "validation")])]),
        ("metrics.png", "Fine-tuning metrics", [("validation", [("eval", k, label) for k, label in metric_keys])]),
    ])


def _plots(metrics_path: str, out_dir: str, figures: list[tuple[str, str, list]]) -> list[str]:
    """The paths of the (file name, title, panels of :func:`_figure`) figures, then lr.png (the schedule), that
    have data to plot: each drawn into ``out_dir``, against the step."""
    if os.environ.get("BERTFORGE_PLOTS") == "0":  # (the test suite's runs: drawing was a quarter of its time)
        return []
    rows = read_metrics(metrics_path)
    os.makedirs(out_dir, exist_ok=True)
    figures = [*figures, ("lr.png", "Schedule", [("learning rate", [("train", "lr", "lr")])])]
    made = [_figure(panels, rows, os.path.join(out_dir, name), title, "step") for name, title, panels in figures]
    return [m for m in made if m]
