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
# # 02 · Tuning the loader: workers, prefetch, pinning, batch size — and is the trainer starving?
#
# One format (WebDataset shards, decoded with the ImageNet eval transform to 224×224) and
# one knob at a time: `num_workers`, `prefetch_factor`, `pin_memory`, batch size, the dtype
# of the batches and what crosses the worker pipes. Then the starvation meter
# (`readers.loader.meter.StarvationMeter`) on a simulated training step, to see when the loader
# keeps up and when it does not.
#
# Every figure comes from this run (median of a few passes over a small dataset, warm page
# cache), on the machine printed below. The conclusions at the end are computed from them.

# %%
# %matplotlib inline
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display

from dataset_bench.machine import machine_info, machine_label
from dataset_bench.measure import eval_transform, measure_loader
from dataset_bench.synth import generate_image_folder
from dataset_bench.targets import pack_formats
from readers import make_loader, open_dataset
from readers.contract.env import available_cpus
from readers.loader.meter import StarvationMeter

# NOTEBOOK_QUICK=1 (the test suite): fewer images and one pass per point; else the run committed here
QUICK = os.environ.get("NOTEBOOK_QUICK") == "1"
N_IMAGES = 96 if QUICK else 512
REPEATS = 1 if QUICK else 3
CORES = available_cpus()
WORK = Path(tempfile.mkdtemp(prefix="nb02-"))
src = generate_image_folder(WORK / "images", N_IMAGES, classes=8, seed=1)
path = pack_formats(src, WORK / "packed", ["wds"])["wds"]
print(machine_label(machine_info()))
print(f"{N_IMAGES} images packed as wds in {path}; usable cores: {CORES}")

# %%
torch_warnings = set()

def measure(make_dataset, repeats=REPEATS, **loader_kwargs):
    """Median samples/s, first-batch time and peak PSS over `repeats` passes of a fresh loader."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [measure_loader(lambda: make_loader(make_dataset(), **loader_kwargs)) for _ in range(repeats)]
    torch_warnings.update(str(w.message) for w in caught)
    rates = [r.samples_per_s for r in runs]
    return {"samples_per_s": statistics.median(rates),
            "spread": (max(rates) - min(rates)) / statistics.median(rates),
            "first_batch_s": statistics.median(r.first_batch_s for r in runs),
            "pss_total_mb": statistics.median(r.pss_total_mb for r in runs),
            "pss_workers_mb": statistics.median(r.pss_workers_mb for r in runs)}

decoded = lambda: open_dataset(path, transform=eval_transform())
raw = lambda: open_dataset(path, decode=False)
measure(decoded, repeats=1, batch_size=32, num_workers=0)  # warm the page cache and imports
print("ready")

# %% [markdown]
# ## 1 · `num_workers`

# %%
workers = list(range(0, 2 * CORES + 1))
by_workers = {w: measure(decoded, batch_size=32, num_workers=w) for w in workers}
for message in sorted(torch_warnings):
    print("torch warned:", message[:160] + ("..." if len(message) > 160 else ""))
for w, m in by_workers.items():
    print(f"num_workers={w}: {m['samples_per_s']:6.0f} samples/s, first batch {m['first_batch_s']:.2f} s, "
          f"PSS {m['pss_total_mb']:.0f} MB (workers {m['pss_workers_mb']:.0f} MB)")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
a1.plot(workers, [by_workers[w]["samples_per_s"] for w in workers], "o-")
a1.axvline(CORES, color="grey", ls="--", lw=1)
a1.text(CORES, a1.get_ylim()[0], f" usable cores = {CORES}", va="bottom", fontsize=8)
a1.set_xlabel("num_workers"); a1.set_ylabel("samples/s"); a1.set_title("throughput (decoded, batch 32)")
a2.plot(workers, [by_workers[w]["pss_total_mb"] for w in workers], "o-", label="main + workers")
a2.plot(workers, [by_workers[w]["pss_workers_mb"] for w in workers], "s--", label="workers only")
a2.set_xlabel("num_workers"); a2.set_ylabel("PSS, MB"); a2.set_title("memory (proportional set size)")
a2.legend()
for ax in (a1, a2):
    ax.set_xticks(workers)
    ax.grid(alpha=0.3)
fig.tight_layout(); plt.show()

# %% [markdown]
# ## 2 · `prefetch_factor` and `pin_memory`

# %%
W = CORES
by_prefetch = {p: measure(decoded, batch_size=32, num_workers=W, prefetch_factor=p) for p in (1, 2, 4)}
for p, m in by_prefetch.items():
    print(f"prefetch_factor={p}: {m['samples_per_s']:6.0f} samples/s, PSS {m['pss_total_mb']:.0f} MB")

torch_warnings.clear()
by_pin = {pin: measure(decoded, batch_size=32, num_workers=W, pin_memory=pin) for pin in (False, True)}
pin_warning = next((m for m in torch_warnings if "pin" in m.lower()), None)
for pin, m in by_pin.items():
    print(f"pin_memory={pin}: {m['samples_per_s']:6.0f} samples/s")
print("CUDA available:", torch.cuda.is_available())
if pin_warning:
    print("torch said:", pin_warning)

# %% [markdown]
# ## 3 · Batch size, and what the batches are made of

# %%
sizes = (8, 32, 128)
by_batch = {b: measure(decoded, batch_size=b, num_workers=W) for b in sizes}
by_batch0 = {b: measure(decoded, batch_size=b, num_workers=0) for b in sizes}
for b in sizes:
    print(f"batch {b:3d}: {by_batch[b]['samples_per_s']:6.0f} samples/s with {W} workers, "
          f"{by_batch0[b]['samples_per_s']:6.0f} with 0 workers")

class ToFloat:
    """The same transform, then float32 in [0, 1] in the worker (what ToTensor() produces)."""
    accepts_bytes = True
    def __init__(self, t):
        self.t = t
    def __call__(self, data):
        return self.t(data).to(torch.float32).div_(255)

as_float = lambda: open_dataset(path, transform=ToFloat(eval_transform()))
u8, f32 = measure(decoded, batch_size=32, num_workers=W), measure(as_float, batch_size=32, num_workers=W)
mb_u8, mb_f32 = 32 * 3 * 224 * 224 / 1e6, 32 * 3 * 224 * 224 * 4 / 1e6
print(f"uint8 batches   ({mb_u8:5.1f} MB each): {u8['samples_per_s']:6.0f} samples/s")
print(f"float32 batches ({mb_f32:5.1f} MB each): {f32['samples_per_s']:6.0f} samples/s")

def bytes_collate(batch):
    """The anti-pattern: a list of Python bytes objects, pickled through the worker pipe."""
    data = [t if isinstance(t, bytes) else t.numpy().tobytes() for t, _ in batch]
    return data, torch.tensor([label for _, label in batch])

as_tensor = measure(raw, batch_size=32, num_workers=W)
as_bytes = measure(raw, batch_size=32, num_workers=W, collate_fn=bytes_collate)
print(f"raw JPEG bytes as one uint8 tensor (ByteBatch): {as_tensor['samples_per_s']:6.0f} samples/s")
print(f"raw JPEG bytes as a list of Python bytes:       {as_bytes['samples_per_s']:6.0f} samples/s")

fig, ax = plt.subplots(figsize=(6, 3.4))
ax.plot(sizes, [by_batch[b]["samples_per_s"] for b in sizes], "o-", label=f"{W} workers")
ax.plot(sizes, [by_batch0[b]["samples_per_s"] for b in sizes], "s--", label="0 workers")
ax.set_xscale("log", base=2); ax.set_xticks(sizes, [str(b) for b in sizes])
ax.set_xlabel("batch size"); ax.set_ylabel("samples/s"); ax.set_title("batch size (decoded)")
ax.grid(alpha=0.3); ax.legend(); fig.tight_layout(); plt.show()


# %% [markdown]
# ## 4 · Is the trainer starving? The starvation meter on a simulated step
#
# `StarvationMeter(loader)` wraps the loader; each step it records the time spent waiting
# for the next batch and the time spent in the loop body. The "training step" here is
# `time.sleep(s)` — a stand-in for a GPU step, which leaves the CPU to the loader — for a
# range of `s`, then a small CPU model (a conv net forward + backward), which competes with
# the loader's workers for the same cores.

# %%
def simulate(step, loader_workers=W, batch=32):
    loader = make_loader(decoded(), batch_size=batch, num_workers=loader_workers)
    meter = StarvationMeter(loader)
    for images, labels in meter:
        step(images)
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator._shutdown_workers()
    return meter.summary()

loader_rate = by_workers[W]["samples_per_s"]
print(f"the loader alone: {loader_rate:.0f} samples/s = {32 / loader_rate * 1e3:.0f} ms per batch of 32")
sleeps = (0.0, 0.02, 0.05, 0.1, 0.2)
by_sleep = {}
for s in sleeps:
    by_sleep[s] = simulate(lambda x, s=s: time.sleep(s))
    m = by_sleep[s]
    print(f"step = sleep {s * 1e3:5.0f} ms: waiting {m['wait_share_pct']:5.1f}% of the time "
          f"(p50 wait {m['wait_p50_ms']:6.1f} ms), {m['samples_per_s']:5.0f} samples/s -> {m['verdict']}")

fig, ax = plt.subplots(figsize=(6.5, 3.4))
ax.plot([s * 1e3 for s in sleeps], [by_sleep[s]["wait_share_pct"] for s in sleeps], "o-")
ax.axhline(20, color="grey", ls="--", lw=1)
ax.axvline(32 / loader_rate * 1e3, color="tab:red", ls=":", lw=1)
ax.text(32 / loader_rate * 1e3, 90, " loader's time per batch", color="tab:red", fontsize=8)
ax.set_xlabel("simulated step time per batch, ms"); ax.set_ylabel("time waiting for data, %")
ax.set_ylim(0, 100); ax.grid(alpha=0.3); ax.set_title("data-wait share vs step time")
fig.tight_layout(); plt.show()

# %%
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 5, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def cpu_step(images):
    x = images.float().div_(255)
    loss = model(x).logsumexp(1).mean()
    opt.zero_grad(); loss.backward(); opt.step()

cpu_model = {w: simulate(cpu_step, loader_workers=w) for w in (0, W)}
for w, m in cpu_model.items():
    print(f"CPU model step, {w} loader workers: {m['samples_per_s']:5.0f} samples/s, step p50 "
          f"{m['step_p50_ms']:.0f} ms, waiting {m['wait_share_pct']:.0f}% -> {m['verdict']}")

meter = StarvationMeter(make_loader(decoded(), batch_size=32, num_workers=W), profile_dir=WORK / "trace",
                        profile_steps=2)
for images, labels in meter:
    meter.to_device((images, labels), "cpu")
    time.sleep(0.02)
print(meter.report())
print("trace size:", meter.trace_path.stat().st_size // 1024, "KB (open in https://ui.perfetto.dev)")


# %% [markdown]
# ## 5 · Rules of thumb, checked against the curves above

# %%
def pct(a, b):
    return f"{(a / b - 1) * 100:+.0f}%"

def differs(a, b, tol=0.15):
    """A difference larger than `tol` and than the run-to-run noise measured below."""
    return abs(a / b - 1) > max(tol, noise)

r = lambda d, k: d[k]["samples_per_s"]
spreads = [m["spread"] for d in (by_workers, by_prefetch, by_pin, by_batch, by_batch0) for m in d.values()]
spreads += [m["spread"] for m in (u8, f32, as_tensor, as_bytes)]
noise = statistics.median(spreads)
best_w = max(by_workers, key=lambda w: r(by_workers, w))
top = 2 * CORES
per_worker = by_workers[top]["pss_workers_mb"] / top
lines = [f"*Noise first: the {REPEATS} passes of one configuration differed by {noise:.0%} (median over all "
         f"configurations; worst {max(spreads):.0%}), so smaller differences below are not findings.*", "",
         f"* **num_workers ≈ usable cores.** {CORES} usable cores here. 0 → {CORES} workers: "
         f"{r(by_workers, 0):.0f} → {r(by_workers, CORES):.0f} samples/s ({r(by_workers, CORES) / r(by_workers, 0):.1f}x). "
         f"{top} workers: {r(by_workers, top):.0f} samples/s ({pct(r(by_workers, top), r(by_workers, CORES))} vs {CORES}) "
         f"for {by_workers[top]['pss_total_mb'] - by_workers[CORES]['pss_total_mb']:+.0f} MB PSS; each worker holds "
         f"about {per_worker:.0f} MB PSS (a forked Python with torch). "
         + (f"Here more workers than cores still paid off (best: {best_w}), so treat the rule as the starting point "
            "of a short sweep like this one." if best_w > CORES and differs(r(by_workers, best_w), r(by_workers, CORES))
            else "More workers than cores bought nothing measurable here.")]
pf = [r(by_prefetch, p) for p in (1, 2, 4)]
lines.append("* **prefetch_factor 2 is usually enough.** 1 / 2 / 4: " + " / ".join(f"{v:.0f}" for v in pf)
             + " samples/s. " + ("Within noise of each other: a deeper queue hides jitter, it cannot make a loader "
                                 "that is slower than the step faster." if not differs(max(pf), min(pf))
                                 else f"The spread is {max(pf) / min(pf) - 1:.0%} here; rerun before trusting it "
                                      "(a deeper queue only hides jitter)."))
lines.append(f"* **pin_memory only helps with CUDA.** CUDA available here: {torch.cuda.is_available()}. "
             f"False / True: {r(by_pin, False):.0f} / {r(by_pin, True):.0f} samples/s"
             + ((" — no accelerator, nothing to pin for; torch warned and ignored the setting"
                 + (f", so the {abs(r(by_pin, True) / r(by_pin, False) - 1):.0%} gap is run-to-run noise."
                    if abs(r(by_pin, True) / r(by_pin, False) - 1) > 0.05 else ".")) if not torch.cuda.is_available()
                else "."))
gain = r(by_batch, sizes[-1]) / r(by_batch, sizes[0])
lines.append(f"* **Batch size amortizes per-batch overhead.** With {W} workers, batch " + " / ".join(map(str, sizes))
             + ": " + " / ".join(f"{r(by_batch, b):.0f}" for b in sizes) + " samples/s; with 0 workers "
             + " / ".join(f"{r(by_batch0, b):.0f}" for b in sizes) + ". "
             + (f"Batch {sizes[-1]} vs {sizes[0]}: {gain:.2f}x." if differs(gain, 1.0)
                else "Per-sample decode dominates, so the batch size barely matters here."))
lines.append(f"* **uint8 batches are 4x smaller than float32** ({mb_u8:.1f} vs {mb_f32:.1f} MB per batch of 32): "
             f"{u8['samples_per_s']:.0f} vs {f32['samples_per_s']:.0f} samples/s "
             + (f"({pct(f32['samples_per_s'], u8['samples_per_s'])} for float32)."
                if differs(f32['samples_per_s'], u8['samples_per_s'], 0.1)
                else "— no measurable difference at this rate, but 4x the shared memory and 4x the bytes to copy to the device.")
             + " Convert and normalize on the device (readers.loader.prefetch.DevicePrefetcher).")
mbs = as_tensor["samples_per_s"] * 100e3 / 1e6
lines.append(f"* **Avoid Python bytes crossing worker pipes.** Raw JPEGs as one uint8 tensor (ByteBatch): "
             f"{as_tensor['samples_per_s']:.0f} samples/s; as a list of Python bytes: {as_bytes['samples_per_s']:.0f} "
             f"({pct(as_bytes['samples_per_s'], as_tensor['samples_per_s'])}). "
             + ("The tensor path wins here." if as_tensor['samples_per_s'] > 1.1 * as_bytes['samples_per_s']
                else f"No measurable difference at ~{mbs:.0f} MB/s of ~100 KB objects: the pipe keeps up with this "
                     "rate; the cost of pickling grows with the number of objects per batch and with faster readers."))
batch_ms = 32 / loader_rate * 1e3
lines.append(f"* **Starving or not.** The loader makes a batch of 32 in about {batch_ms:.0f} ms. Steps shorter than "
             f"that leave the trainer waiting (sleep 20 ms: {by_sleep[0.02]['wait_share_pct']:.0f}% of the time), "
             f"longer ones hide the loader (sleep 200 ms: {by_sleep[0.2]['wait_share_pct']:.0f}%). A CPU-bound step "
             f"shares the {CORES} cores with the workers: the small CPU model ran at "
             f"{cpu_model[0]['samples_per_s']:.0f} samples/s with the loading in the main process (0 workers, "
             f"{cpu_model[0]['wait_share_pct']:.0f}% waiting) and {cpu_model[W]['samples_per_s']:.0f} samples/s with "
             f"{W} workers ({cpu_model[W]['wait_share_pct']:.0f}% waiting).")
display(Markdown("\n".join(lines)))

# %%
shutil.rmtree(WORK, ignore_errors=True)
