# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Training outcome: does every format train the same model as the folder?
#
# A storage layer is judged by what the model learns from it. Real images that ship with a
# package (scikit-learn's `load_digits`: 1,797 8×8 grayscale digits, 10 classes), upsampled to
# 32×32 and written as an ImageFolder of PNGs, split 80/20 (stratified). A small CNN is trained
# on CPU from
#
# * **folder**: the PNGs through a plain torch `Dataset` + `RandomSampler` (the baseline);
# * **every format of ours** (`pack()` with default options, `open_dataset` + `make_loader` with
#   default options, shuffle on);
# * **folder, class-sorted**: the same folder in its listing order, no shuffle: a deliberately
#   bad order, to show that the shuffle-quality metric and the accuracy can fail.
#
# Same seeds (model initialisation and loader order), batch, optimiser, epochs, decode and
# transform everywhere: the rows differ only by storage and order. The work is
# `benchmarks/bench_train.py` (this notebook runs its `run()`); the figures below come from this
# run, on the machine printed below.

# %%
# %matplotlib inline
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import readers

# benchmarks/ is not a package: load the benchmark by path, from the checkout `readers` comes from
SCRIPT = Path(readers.__file__).resolve().parent.parent / "benchmarks" / "bench_train.py"
spec = importlib.util.spec_from_file_location("bench_train", SCRIPT)
bench_train = importlib.util.module_from_spec(spec)
sys.modules["bench_train"] = bench_train  # its dataclasses look their module up there
spec.loader.exec_module(bench_train)

# NOTEBOOK_QUICK=1 (the test suite): the benchmark's --quick size; else the full run
QUICK = os.environ.get("NOTEBOOK_QUICK") == "1"
cfg = bench_train.Config(**(bench_train.QUICK if QUICK else {}))
WORK = Path(tempfile.mkdtemp(prefix="nb03-"))
print(bench_train.machine())
print(f"{cfg.epochs} epochs x seeds {list(cfg.seeds)}, batch {cfg.batch_size}, Adam lr {cfg.lr}, "
      f"{cfg.num_workers} loader workers, {cfg.threads} torch thread(s)")

# %%
result = bench_train.run(cfg, WORK)
summary = {s["row"]: s for s in result["summary"]}

# %% [markdown]
# ## The table
#
# Final validation accuracy over the seeds, the epochs (and training seconds, loading included)
# to reach the target accuracy, and the shuffle quality of the batches each row trained on
# (`readers.order.quality.measure`, as `dataset-bench` reports it: distinct classes per batch, and how
# far samples move from their stored position, each against a uniform shuffle's).

# %%
display(Markdown("\n".join(bench_train.table(result["summary"], cfg))))

# %%
rows = list(summary)
colors = {row: f"C{k}" for k, row in enumerate(rows)}
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
for ax, shown in ((left, rows), (right, [r for r in rows if r != bench_train.SORTED])):
    for row in shown:
        curves = np.array([r["accuracy"] for r in result["runs"] if r["row"] == row])
        epochs = np.arange(1, curves.shape[1] + 1)
        ax.plot(epochs, 100 * curves.mean(0), marker="o", ms=3, color=colors[row],
                label=f"{row} (distinct classes {summary[row]['distinct_ratio']:.2f}x)")
        if len(curves) > 1 and ax is left:
            ax.fill_between(epochs, 100 * curves.min(0), 100 * curves.max(0), alpha=0.15, color=colors[row])
    ax.axhline(100 * cfg.target, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="epoch", ylabel="validation accuracy, %")
    ax.legend(fontsize=8)
left.set(ylim=(0, 100), title="validation accuracy, mean over seeds (min-max shaded)")
right.set(ylim=(90, 100), title="the shuffled rows, zoomed (means over seeds)")
fig.suptitle(result["machine"], fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What the run shows

# %%
base, bad = summary[bench_train.BASELINE], summary[bench_train.SORTED]
formats = [summary[f] for f in rows if f not in (bench_train.BASELINE, bench_train.SORTED)]
n_val = result["val_images"]
noise = 100 * np.sqrt(base["accuracy_mean"] * (1 - base["accuracy_mean"]) / n_val)
pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
inside = [s["row"] for s in formats if s["within_baseline"]]
outside = [s["row"] for s in formats if not s["within_baseline"]]
lines = [
    f"* **Same samples everywhere.** Every row's first epoch delivered exactly the folder's "
    f"{result['train_images']} training images (pixels and labels hashed): "
    + ("yes for every row." if all(s["same_samples"] for s in summary.values())
       else "NOT for every row: see the table."),
    f"* **Every format against the folder.** Baseline {pct(base['accuracy_mean'])} "
    f"(min-max {pct(base['accuracy_min'])}–{pct(base['accuracy_max'])} over {base['seeds']} seed(s)); "
    + ", ".join(f"{s['row']} {pct(s['accuracy_mean'])}" for s in formats) + ". "
    + (f"Within the baseline's min-max: {', '.join(inside) or 'none'}"
       + (f"; outside it: {', '.join(outside)}" if outside else "") + ". ")
    + f"For scale: one validation image is {100 / n_val:.2f} points, and the binomial noise of an accuracy "
      f"near {pct(base['accuracy_mean'])} on {n_val} images is ±{noise:.1f} points.",
    f"* **The bad order fails, and the metric says so.** Class-sorted, unshuffled: {pct(bad['accuracy_mean'])} "
    f"(chance is 10%: every epoch ends on a run of one digit) with {bad['distinct_ratio']:.2f}x the distinct "
    f"classes per batch of a uniform shuffle, against {base['distinct_ratio']:.2f}x for the folder baseline and "
    + "–".join(dict.fromkeys(f"{f(s['distinct_ratio'] for s in formats):.2f}x" for f in (min, max)))
    + " for our formats.",
]
lmdb_like = [s for s in formats if s["row"] != "wds"]
curves = lambda row: [r["accuracy"] for r in result["runs"] if r["row"] == row]  # noqa: E731
if all(curves(s["row"]) == curves(lmdb_like[0]["row"]) for s in lmdb_like):
    lines.append(f"* **{', '.join(s['row'] for s in lmdb_like)} trained identical models** (the same accuracy "
                 "after every epoch, for every seed): their readers share one sampler (`EpochSampler`), which "
                 "draws the same permutation for the same seed, and they store the samples in the same (source) "
                 "order, so each seed saw the same batches. wds orders its samples itself (shards, then a "
                 "shuffle buffer) and differs.")
display(Markdown("\n".join(lines)))

# %%
shutil.rmtree(WORK, ignore_errors=True)
