"""A run's result for people: the markdown table, the raw limits, the headline, the PNG chart, the printout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dataset_bench.machine import machine_label
from dataset_bench.plan import CACHES
from dataset_bench.results import BenchResult
from dataset_bench.targets import NAIVE
from readers.contract.spec import FORMATS

__all__ = ["format_table", "format_limits", "headline", "draw_chart", "report_text"]

_DECODE_LABELS = {
    "pil_decode": "PIL decode (open + convert RGB)",
    "decode_rgb": "readers.decode.decoders.decode_rgb (auto)",
    "eval_transform": "decoded mode's per-sample work (decode + eval transform 224)",
    "eval_transform_bytes": "eval transform called on the JPEG bytes (fused reduced decode)",
    "naive_item": "naive per-file work (PIL decode + resize + crop + float tensor)",
}


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _shuffle(row: dict) -> str:
    """Distinct classes per batch against a uniform shuffle's (readers.order.quality), e.g. ``0.99x``."""
    value = row.get("shuffle_ratio")
    return "-" if value is None else f"{value:.2f}x"


def format_table(result: BenchResult) -> str:
    """The main table as GitHub markdown: decoded rows first, then raw; warm before cold; by workers."""
    lines = ["| mode | cache | workers | reader | samples/s | MB/s | x naive | first batch s | PSS MB (workers) "
             "| shuffle x uniform |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    order = {n: i for i, n in enumerate((NAIVE,) + FORMATS)}
    rows = sorted(result.rows, key=lambda r: (r["mode"] != "decoded", r["cache"] != "warm", r["workers"],
                                              order[r["target"]]))
    for r in rows:
        pss = "-" if r["pss_total_mb"] is None else f"{r['pss_total_mb']:,.0f} ({r['pss_workers_mb']:,.0f})"
        ratio = "-" if r["x_naive"] is None else f"{r['x_naive']:.2f}x"
        label = "naive PIL folder" if r["target"] == NAIVE else r["target"]
        rate = (f"too short ({r['window_batches']} b, {r['window_s']:.3f} s)" if r.get("refused")
                else _fmt(r["samples_per_s"]))
        lines.append(f"| {r['mode']} | {r['cache']} | {r['workers']} | {label} | {rate} | "
                     f"{_fmt(r['mb_per_s'], 1)} | {ratio} | {_fmt(r['first_batch_s'], 2)} | {pss} | "
                     f"{_shuffle(r)} |")
    return "\n".join(lines)


def format_limits(result: BenchResult) -> str:
    """The raw limits as markdown: sequential read per dataset, single-core decode rates."""
    lim = result.limits
    if not lim:
        return ""
    lines = ["| files read sequentially (8 MiB reads) | MB | cold MB/s | warm MB/s |", "|---|---:|---:|---:|"]
    for name, v in lim.get("sequential_read", {}).items():
        label = f"source folder ({v['files']} files)" if name == NAIVE else f"{name} ({v['files']} files)"
        lines.append(f"| {label} | {_fmt(v['cold']['mb'], 1)} | {_fmt(v['cold']['mb_per_s'])} | "
                     f"{_fmt(v['warm']['mb_per_s'])} |")
    dec = lim.get("decode_single_core", {})
    if dec:
        lines += ["", "| single core, source JPEGs in memory | images/s | MB/s (compressed) |", "|---|---:|---:|"]
        for key, v in dec.items():
            lines.append(f"| {_DECODE_LABELS.get(key, key)} | {_fmt(v['images_per_s'])} | {_fmt(v['mb_per_s'], 1)} |")
    return "\n".join(lines)


def headline(result: BenchResult) -> list[str]:
    """One line per (cache, workers): each format's decoded samples/s as a multiple of the naive baseline."""
    out = []
    for cache in CACHES:
        for w in result.config["workers"]:
            parts = [f"{r['target']} {r['x_naive']:.1f}x" for r in result.rows
                     if r["cache"] == cache and r["workers"] == w and r["x_naive"] is not None
                     and r["target"] != NAIVE]
            base = result.row(NAIVE, "decoded", w, cache)
            if parts and base:
                out.append(f"decoded to 224, {cache} cache, {w} workers: " + ", ".join(parts)
                           + f" the naive PIL folder ({base['samples_per_s']:.0f} samples/s)")
    return out


def _bars(ax: Any, result: BenchResult, mode: str, names: list[str], combos: list[tuple[str, int]]) -> None:
    """One panel: a group of bars per reader, one bar per (cache, workers); decoded bars labelled x naive."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab20")
    width = 0.8 / max(1, len(combos))
    for k, (cache, w) in enumerate(combos):
        xs, ys, ratios = [], [], []
        for i, n in enumerate(names):
            r = result.row(n, "decoded" if n == NAIVE else mode, w, cache)
            if r and r["samples_per_s"]:
                xs.append(i + (k - (len(combos) - 1) / 2) * width)
                ys.append(r["samples_per_s"])
                ratios.append(r["x_naive"])
        color = cmap((2 * (k % len(result.config["workers"]))) + (1 if cache == "cold" else 0))
        bars = ax.bar(xs, ys, width, label=f"{w} worker{'s' if w != 1 else ''}, {cache} cache", color=color,
                      hatch="//" if cache == "cold" else None, edgecolor="black", linewidth=0.4)
        if mode == "decoded":
            for b, ratio in zip(bars, ratios):
                if ratio is not None and b.get_x() > 0.5:  # not on the naive bars themselves
                    ax.annotate(f"{ratio:.1f}x", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                                va="bottom", fontsize=6.5, rotation=90, xytext=(0, 2), textcoords="offset points")


def _axes_style(ax: Any, mode: str, names: list[str]) -> None:
    """Ticks, log scale, labels and limits of one panel."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(["naive\nPIL folder" if n == NAIVE else n for n in names])
    values = [b.get_height() for b in ax.patches if b.get_height() > 0]
    if not values:  # every figure refused (timing windows too short): say so, no empty log axis
        ax.text(0.5, 0.5, "no figure: every timing window too short", ha="center", va="center",
                transform=ax.transAxes)
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}" if str(int(v))[0] in "25" else ""))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylabel("samples/s (log scale, median)")
    ax.set_title("decoded + eval transform to 224 (labels: x naive)" if mode == "decoded"
                 else "raw: stored bytes (mmap: stored 256x256 pixels)", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_ylim(min(values) / 1.6, max(values) * 1.8)  # every bar visible from its base; room for the labels


def draw_chart(result: BenchResult, path: str | os.PathLike) -> Path:
    """Bar chart (PNG, matplotlib Agg): samples/s per reader, one panel per mode, bars per workers x cache."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    modes = [m for m in ("decoded", "raw") if any(r["mode"] == m and r["target"] != NAIVE for r in result.rows)]
    modes = modes or ["decoded"]
    names = [n for n in (NAIVE,) + FORMATS if any(r["target"] == n for r in result.rows)]
    combos = [(c, w) for c in CACHES for w in result.config["workers"]
              if any(r["cache"] == c and r["workers"] == w for r in result.rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6.2 * len(modes), 4.8), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        shown = [n for n in names if n != NAIVE or mode == "decoded"]
        _bars(ax, result, mode, shown, combos)
        _axes_style(ax, mode, shown)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(f"dataset-bench: {result.targets[0]['samples'] if result.targets else '?'} images, "
                 f"batch {result.config['batch_size']}, median of {result.config['repeats']}\n"
                 f"{machine_label(result.machine)}", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_text(result: BenchResult) -> str:
    """Everything the command prints: machine, headline, table, limits, notes."""
    parts = [f"machine: {machine_label(result.machine)}",
             "datasets: " + "; ".join(f"{t['name']} {t['samples']} samples, {t['data_mb']} MB in "
                                      f"{t['files']} files" for t in result.targets),
             f"decoded mode transform: {result.transform}",
             f"batch size {result.config['batch_size']}, median of {result.config['repeats']} repeats; "
             "samples/s: steady rate, from batch max(1, workers) to the last; first batch s includes worker "
             "start-up", ""]
    refused = [r for r in result.rows if r.get("refused")]
    if refused:
        cfg = result.config
        parts += [f"REFUSED: {len(refused)} of {len(result.rows)} figures were timed over fewer than "
                  f"{cfg.get('min_window_batches')} batches or {cfg.get('min_window_s')} s (shown as 'too short'; "
                  "a rate from a batch or two times what the workers had prefetched); give more samples "
                  "(--generate N, --max-samples) or a smaller --batch-size", ""]
    lines = headline(result)
    if lines:
        parts += ["headline (decoded samples/s vs the naive baseline):"] + [f"  {h}" for h in lines] + [""]
    parts += [format_table(result), ""]
    if result.limits:
        parts += ["raw limits of this machine:", format_limits(result), ""]
    parts += [f"note: {n}" for n in result.notes]
    parts.append(f"total run time {result.seconds:.0f} s")
    return "\n".join(parts)
