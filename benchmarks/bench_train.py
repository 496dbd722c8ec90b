#!/usr/bin/env python
"""Training outcome: does a model trained from each packed format learn what it learns from the folder?

Real images that ship with a package: scikit-learn's ``load_digits`` (1,797
8x8 grayscale digits, 10 classes), upsampled to 32x32 (nearest neighbour)
and written as an ImageFolder of PNGs, split 80/20 into train/val
(stratified, fixed seed). A small CNN is trained on CPU from

* ``folder``: the PNG folder through a plain torch ``Dataset`` + ``RandomSampler``
  (the baseline);
* every format of ours: ``packer.pack()`` with default options, read with
  ``readers.open_dataset`` + ``readers.make_loader`` with default options
  (shuffle on);
* ``folder, class-sorted``: the same folder read in its listing order (class by
  class, no shuffle), a deliberately bad order to show the metric can fail;

with the same seeds (model initialisation and loader order), the same batch
size, optimiser and epochs, and the same decode and transform for every row
(the RGB pixels as a uint8 tensor, one channel, float, normalized): the rows
differ only by storage and order. Each row's first epoch is checked to deliver
exactly the folder's training samples (same pixels, same labels).

The table gives, per row, the final validation accuracy (mean ± std over the
seeds, and min-max), the epochs (and training seconds) to reach ``--target``
validation accuracy, and the shuffle quality of the batches that row trained
on (``readers.order.quality.measure``, as ``dataset-bench`` reports it: distinct
classes per batch and displacement, each against a uniform shuffle's).

Usage::

    python benchmarks/bench_train.py                 # 3 seeds x 10 epochs, about 5 minutes on 2 busy cores
    python benchmarks/bench_train.py --quick         # 1 seed x 3 epochs, under a minute (CI)
    python benchmarks/bench_train.py --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler

from dataset_bench.measure import shutdown_loader
from packer import PackOptions, pack
from readers import make_loader, open_dataset
from readers.contract.env import available_cpus, default_workers
from readers.order.quality import measure
from readers.contract.spec import FORMATS

#: The rows, in table order: the baseline, every format of ours, the bad order.
BASELINE, SORTED = "folder", "folder, class-sorted"
ROWS = (BASELINE, *FORMATS, SORTED)
SIZE = 32  # the 8x8 digits, upsampled 4x (nearest)
VAL_FRACTION = 0.2
SPLIT_SEED = 0
# the digits' pixel mean and std (of 0..1 values, over the whole set), for the normalization
MEAN, STD = 0.305, 0.376


@dataclass(frozen=True)
class Config:
    """What every row is trained with."""

    epochs: int = 10
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_size: int = 32
    lr: float = 3e-3
    target: float = 0.97  # validation accuracy for "time to target"
    threads: int = 1  # torch threads of the training process
    num_workers: int = field(default_factory=default_workers)  # make_loader's default, used for the folder too


QUICK = {"epochs": 3, "seeds": (0,)}


# --------------------------------------------------------------------------- data


def write_digits(root: Path, size: int = SIZE) -> tuple[Path, Path]:
    """scikit-learn's digits as ``root/train/<digit>/<n>.png`` and ``root/val/...`` (stratified split)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
    scale = size // pixels.shape[1]
    pixels = pixels.repeat(scale, axis=1).repeat(scale, axis=2)
    ids = np.arange(len(pixels))
    train, val = train_test_split(ids, test_size=VAL_FRACTION, stratify=digits.target, random_state=SPLIT_SEED)
    for split, chosen in (("train", train), ("val", val)):
        for i in sorted(chosen):
            folder = root / split / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[i], "L").save(folder / f"{i:04d}.png")
    return root / "train", root / "val"


class FolderDataset(Dataset):
    """A plain ImageFolder reader: sorted class folders, sorted files; items ``(uint8 CHW RGB, label, index)``."""

    def __init__(self, root: Path) -> None:
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.files = [(str(f), c) for c, name in enumerate(self.classes) for f in sorted((root / name).iterdir())]
        self.labels = np.array([c for _, c in self.files], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        path, label = self.files[i]
        with Image.open(path) as img:
            hwc = np.asarray(img.convert("RGB"))
        return torch.from_numpy(hwc.copy()).permute(2, 0, 1).contiguous(), label, i


def to_input(images: torch.Tensor) -> torch.Tensor:
    """The transform every row shares: uint8 (B, 3, H, W) RGB of a gray image -> normalized float (B, 1, H, W)."""
    return (images[:, :1].float() / 255 - MEAN) / STD


def sample_digest(images: torch.Tensor, labels: torch.Tensor) -> list[str]:
    """One hash per sample of a batch (pixels and label): the rows' samples compared as multisets."""
    return [hashlib.sha1(img.numpy().tobytes() + int(y).to_bytes(2, "little")).hexdigest()
            for img, y in zip(images, labels)]


# --------------------------------------------------------------------------- model


def small_cnn() -> nn.Module:
    """Two conv blocks and a linear layer (~10k parameters, ~0.4 M multiply-adds a sample): 1x32x32 -> 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, stride=2, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 16x8x8
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32x4x4
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10),
    )


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    return float((model(to_input(images)).argmax(1) == labels).float().mean())


# --------------------------------------------------------------------------- rows


@dataclass
class Run:
    """One row trained with one seed."""

    row: str
    seed: int
    accuracy: list[float]  # validation accuracy after each epoch
    seconds: list[float]  # cumulative training seconds (loading included, evaluation excluded) after each epoch
    samples_per_epoch: int
    distinct_ratio: float  # shuffle quality of the first epoch's batches
    displacement_ratio: float | None
    same_samples: bool  # the first epoch delivered exactly the folder's training samples

    def epochs_to(self, target: float) -> int | None:
        return next((e + 1 for e, a in enumerate(self.accuracy) if a >= target), None)

    def seconds_to(self, target: float) -> float | None:
        e = self.epochs_to(target)
        return None if e is None else self.seconds[e - 1]


def loader_for(row: str, seed: int, cfg: Config, train: Path, packed: dict[str, Path]) -> tuple[Iterable, list[int]]:
    """The row's loader (items ``(images, labels, indices)``) and its dataset's class counts."""
    if row in (BASELINE, SORTED):
        ds = FolderDataset(train)
        generator = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(ds, generator=generator) if row == BASELINE else SequentialSampler(ds)
        loader = DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.num_workers,
                            persistent_workers=cfg.num_workers > 0)
        return loader, np.bincount(ds.labels, minlength=len(ds.classes)).tolist()
    ds = open_dataset(packed[row], return_index=True)  # the index only feeds the displacement metric
    return make_loader(ds, batch_size=cfg.batch_size, seed=seed), list(ds.index.meta["class_counts"])


def train_row(row: str, seed: int, cfg: Config, train: Path, packed: dict[str, Path],
              val: tuple[torch.Tensor, torch.Tensor], reference: list[str]) -> Run:
    """Train a fresh model (initialised from ``seed``) on ``row``'s loader for ``cfg.epochs`` epochs."""
    torch.manual_seed(seed)
    model = small_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loss_fn = nn.CrossEntropyLoss()
    loader, class_counts = loader_for(row, seed, cfg, train, packed)
    accs, secs, elapsed = [], [], 0.0
    first: list[tuple[None, np.ndarray, np.ndarray]] = []
    digests: list[str] = []
    try:
        for epoch in range(cfg.epochs):
            model.train()
            t0 = time.perf_counter()
            for images, labels, indices in loader:
                if epoch == 0:
                    first.append((None, labels.numpy(), indices.numpy()))
                    digests += sample_digest(images, labels)
                opt.zero_grad()
                loss_fn(model(to_input(images)), labels).backward()
                opt.step()
            elapsed += time.perf_counter() - t0
            secs.append(round(elapsed, 3))
            accs.append(round(accuracy(model, *val), 4))
    finally:
        shutdown_loader(loader)  # persistent workers: stop them now, not at garbage collection
    quality = measure(first, class_counts, sum(class_counts))
    return Run(row, seed, accs, secs, sum(len(b[1]) for b in first), round(quality.distinct_ratio, 3),
               None if quality.displacement_ratio is None else round(quality.displacement_ratio, 3),
               sorted(digests) == reference)


def load_val(val_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    ds = FolderDataset(val_dir)
    items = [ds[i] for i in range(len(ds))]
    return torch.stack([x for x, _, _ in items]), torch.tensor([y for _, y, _ in items])


def reference_digests(train: Path) -> list[str]:
    ds = FolderDataset(train)
    items = [ds[i] for i in range(len(ds))]
    return sorted(sample_digest(torch.stack([x for x, _, _ in items]), torch.tensor([y for _, y, _ in items])))


def pack_all(train: Path, out: Path) -> dict[str, Path]:
    """``train`` packed into every format, each with ``pack()``'s default options."""
    packed = {}
    for fmt in FORMATS:
        (result,) = pack(train, out / fmt, PackOptions(format=fmt))
        packed[fmt] = result.out
    return packed


# --------------------------------------------------------------------------- report


def summarize(runs: list[Run], cfg: Config) -> list[dict[str, Any]]:
    """One dict per row: accuracy mean/std/min/max over seeds, time to target, shuffle quality."""
    out = []
    for row in ROWS:
        mine = [r for r in runs if r.row == row]
        final = [r.accuracy[-1] for r in mine]
        reached = [r for r in mine if r.epochs_to(cfg.target) is not None]
        disp = [r.displacement_ratio for r in mine if r.displacement_ratio is not None]
        out.append({
            "row": row,
            "seeds": len(mine),
            "samples_per_epoch": mine[0].samples_per_epoch,
            "same_samples": all(r.same_samples for r in mine),
            "accuracy_mean": statistics.fmean(final),
            "accuracy_std": statistics.stdev(final) if len(final) > 1 else 0.0,
            "accuracy_min": min(final),
            "accuracy_max": max(final),
            "reached_target": len(reached),
            "epochs_to_target": statistics.fmean(r.epochs_to(cfg.target) for r in reached) if reached else None,
            "seconds_to_target": statistics.fmean(r.seconds_to(cfg.target) for r in reached) if reached else None,
            "seconds_per_epoch": statistics.fmean(r.seconds[-1] / len(r.seconds) for r in mine),
            "distinct_ratio": statistics.fmean(r.distinct_ratio for r in mine),
            "displacement_ratio": statistics.fmean(disp) if disp else None,
        })
    base = out[0]
    for s in out:
        s["within_baseline"] = base["accuracy_min"] <= s["accuracy_mean"] <= base["accuracy_max"]
    return out


def table(summary: list[dict[str, Any]], cfg: Config) -> list[str]:
    """The markdown table, one line per row."""
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731
    lines = [f"| row | samples / epoch | same samples | val accuracy % (mean ± std) | min–max | "
             f"epochs to {pct(cfg.target)}% | s to {pct(cfg.target)}% | s / epoch | "
             f"distinct classes / batch vs uniform | displacement vs uniform |",
             "|---|---:|:-:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        reach = "never" if s["epochs_to_target"] is None else f"{s['epochs_to_target']:.1f}"
        if s["epochs_to_target"] is not None and s["reached_target"] < s["seeds"]:
            reach += f" ({s['reached_target']}/{s['seeds']} seeds)"
        secs = "-" if s["seconds_to_target"] is None else f"{s['seconds_to_target']:.1f}"
        disp = "-" if s["displacement_ratio"] is None else f"{s['displacement_ratio']:.2f}x"
        lines.append(f"| {s['row']} | {s['samples_per_epoch']} | {'yes' if s['same_samples'] else 'NO'} | "
                     f"{pct(s['accuracy_mean'])} ± {pct(s['accuracy_std'])} | "
                     f"{pct(s['accuracy_min'])}–{pct(s['accuracy_max'])} | {reach} | {secs} | "
                     f"{s['seconds_per_epoch']:.2f} | {s['distinct_ratio']:.2f}x | {disp} |")
    return lines


def machine() -> str:
    """One line naming the machine and the library versions."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return (f"{platform.node()}: {cpu}, {available_cpus()} usable cores; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def run(cfg: Config, work: Path, log=print) -> dict[str, Any]:
    """The whole benchmark in ``work``: the folder, the packs, every row x seed. Returns the results."""
    torch.set_num_threads(cfg.threads)
    train, val_dir = write_digits(work / "digits")
    t0 = time.perf_counter()
    packed = pack_all(train, work / "packed")
    log(f"packed {len(FolderDataset(train))} training images into {', '.join(FORMATS)} "
        f"in {time.perf_counter() - t0:.1f} s")
    val, reference = load_val(val_dir), reference_digests(train)
    runs = []
    for seed in cfg.seeds:
        for row in ROWS:
            r = train_row(row, seed, cfg, train, packed, val, reference)
            log(f"  seed {seed} {row}: val accuracy {r.accuracy[-1]:.3f} after {cfg.epochs} epochs "
                f"({r.seconds[-1]:.1f} s); distinct classes ratio {r.distinct_ratio:.2f}")
            runs.append(r)
    return {"config": asdict(cfg), "machine": machine(), "train_images": len(reference), "val_images": len(val[1]),
            "runs": [asdict(r) for r in runs], "summary": summarize(runs, cfg)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"fewer epochs and seeds ({QUICK}), every row: for CI")
    p.add_argument("--epochs", type=int, help="epochs per run (default 10; --quick 3)")
    p.add_argument("--seeds", type=int, help="seeds per row: 0..N-1 (default 3; --quick 1)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    kw: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.epochs is not None:
        kw["epochs"] = args.epochs
    if args.seeds is not None:
        kw["seeds"] = tuple(range(args.seeds))
    if kw.get("epochs", 1) < 1 or not kw.get("seeds", (0,)):
        p.error("--epochs and --seeds must be at least 1")
    cfg = Config(**kw)
    print(machine())
    print(f"digits: {cfg.epochs} epochs x seeds {list(cfg.seeds)}, batch {cfg.batch_size}, Adam lr {cfg.lr}, "
          f"{cfg.num_workers} loader workers, {cfg.threads} torch thread(s)")
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        result = run(cfg, Path(tmp))
    print()
    print("\n".join(table(result["summary"], cfg)))
    base, bad = result["summary"][0], result["summary"][-1]
    print(f"\nformats within the folder baseline's min-max: "
          f"{', '.join(s['row'] for s in result['summary'][1:-1] if s['within_baseline']) or 'none'}; "
          f"class-sorted: {100 * bad['accuracy_mean']:.1f}% vs {100 * base['accuracy_mean']:.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
