"""Memory of DataLoader workers (PSS/USS from /proc/<pid>/smaps_rollup) over full epochs.

The measurement runs in a fresh Python process (``python tests/test_memory.py ROOT...``), as a
training script would: forked workers share the parent's heap copy-on-write, and pytest's own heap
(hundreds of MB of test and hypothesis objects) would otherwise be what the workers slowly copy
when their garbage collector walks it -- that says nothing about the readers.

Figures measured on the 2-CPU development container (300 noisy 384x288 JPEGs, 23 MB encoded,
95 MB as mmap pixels; batch 16, persistent workers, epochs 0..2; one fresh process per format):

* main + workers total PSS grows by 5..30 MB per extra worker (mmap, lmdb, wds): a forked
  worker shares the parent's pages; what it adds is its own heap and decode buffers;
* one worker's PSS is 65..205 MB: 60..100 MB anonymous (its share of the inherited torch/numpy
  runtime plus its heap) plus, for mmap, the mapped pixel pages it touched (file-backed page
  cache, shared by every worker, never copied: ~100 MB with one worker, ~50 MB each with two);
* PSS moves by < 10 MB from epoch 1 to epoch 2 (a decoded batch is ~5 MB: allocator noise).

Bounds below leave a wide margin over those figures (other processes on the machine shift the
shared-library part of PSS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MB = 2**20
WORKERS = (1, 2, 0)  # 0 last: decoding in the main process first would grow the heap the workers fork from
EPOCHS = 3
# An extra worker may add this much to the total PSS of main + workers (measured <= ~30 MB).
EXTRA_WORKER_BOUND = 100 * MB
# A worker's anonymous PSS (inherited runtime share + its heap; measured <= ~100 MB).
WORKER_ANON_BOUND = 150 * MB
# A worker's whole PSS, file-backed pages included (mmap maps the pixels; measured <= ~205 MB).
WORKER_PSS_BOUND = 300 * MB
# Growth of PSS from epoch 1 to epoch 2 with persistent workers (measured < 10 MB).
EPOCH_GROWTH_BOUND = 20 * MB


def rollup(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup in bytes, plus USS = Private_Clean + Private_Dirty."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    out["USS"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def measure(root: str, workers: int, epochs: int = EPOCHS, batch_size: int = 16) -> list[dict]:
    """Per epoch: main and per-worker PSS/USS at the end, and each worker's peak PSS while iterating."""
    from readers import make_loader, open_dataset

    loader = make_loader(open_dataset(root), batch_size=batch_size, num_workers=workers, seed=0,
                         persistent_workers=True, workers="processes")  # the memory of worker processes
    out = []
    for _ in range(epochs):
        it = iter(loader)
        pids = [p.pid for p in getattr(it, "_workers", [])]
        peak = dict.fromkeys(pids, 0)
        samples = 0
        for k, (images, labels) in enumerate(it):
            samples += len(labels)
            if k % 3 == 1:  # while iterating
                for p in pids:
                    peak[p] = max(peak[p], rollup(p)["Pss"])
        end = {p: rollup(p) for p in pids}
        main = rollup(os.getpid())
        out.append({
            "samples": samples,
            "main_pss": main["Pss"],
            "worker_pss": [end[p]["Pss"] for p in pids],
            "worker_peak_pss": [max(peak[p], end[p]["Pss"]) for p in pids],
            "worker_uss": [end[p]["USS"] for p in pids],
            "worker_anon": [end[p]["Pss_Anon"] for p in pids],
            "worker_file": [end[p]["Pss_File"] for p in pids],
            "total_pss": main["Pss"] + sum(end[p]["Pss"] for p in pids),
        })
    del it, loader
    return out


def _noisy_folder(root: Path, classes: int = 3, per_class: int = 100, size=(384, 288)) -> Path:
    """Noisy JPEGs (~75 KB each), so encoded and pixel datasets are tens of MB."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    for c in range(classes):
        d = root / f"c{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            base = np.stack([(xx + 7 * i) % 256, (yy + 3 * c) % 256, (xx + yy) % 256], -1)
            img = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(d / f"{i:04d}.jpg", quality=90)
    return root


FORMATS_MEASURED = ("mmap", "lmdb", "wds")


def _mb(values: list[int]) -> list[float]:
    return [round(v / MB, 1) for v in values]


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> dict:
    from packer import PackOptions, pack

    tmp = tmp_path_factory.mktemp("memory")
    src = _noisy_folder(tmp / "src")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    data = {}
    for fmt in FORMATS_MEASURED:  # one fresh process per format: no heap carried over between runs
        pack(src, tmp / fmt, PackOptions(format=fmt, workers=2))
        res = subprocess.run([sys.executable, __file__, str(tmp / fmt)], capture_output=True, text=True,
                             timeout=120, env=env)
        assert res.returncode == 0, res.stderr[-4000:]
        data.update(json.loads(res.stdout.strip().splitlines()[-1]))
    return data


@pytest.mark.parametrize("fmt", FORMATS_MEASURED)
def test_every_epoch_is_complete(figures, fmt, capsys):
    with capsys.disabled():
        print(f"\n[memory] {fmt}: PSS in MB per epoch (300 images, batch 16, persistent workers)")
        for w, epochs in figures[fmt].items():
            for e, r in enumerate(epochs):
                print(f"[memory] {fmt:4s} workers={w} epoch {e}: total {r['total_pss'] / MB:6.1f}  "
                      f"main {r['main_pss'] / MB:6.1f}  workers PSS {_mb(r['worker_pss'])} "
                      f"(peak {_mb(r['worker_peak_pss'])}, anon {_mb(r['worker_anon'])}, "
                      f"file {_mb(r['worker_file'])}, USS {_mb(r['worker_uss'])})")
    assert all(r["samples"] == 300 for per_w in figures[fmt].values() for r in per_w)


@pytest.mark.parametrize("fmt", FORMATS_MEASURED)
def test_extra_worker_memory_is_bounded(figures, fmt, capsys):
    runs = {int(w): epochs for w, epochs in figures[fmt].items()}
    total = {w: max(r["total_pss"] for r in runs[w][1:]) for w in runs}
    with capsys.disabled():
        print(f"\n[memory] {fmt}: total PSS 0/1/2 workers = "
              f"{total[0] / MB:.0f}/{total[1] / MB:.0f}/{total[2] / MB:.0f} MB; per extra worker "
              f"{(total[1] - total[0]) / MB:+.0f}, {(total[2] - total[1]) / MB:+.0f} MB")
    assert total[1] - total[0] < EXTRA_WORKER_BOUND
    assert total[2] - total[1] < EXTRA_WORKER_BOUND
    assert total[2] - total[0] < 2 * EXTRA_WORKER_BOUND
    for w in (1, 2):
        for r in runs[w]:
            assert max(r["worker_peak_pss"]) < WORKER_PSS_BOUND
            assert max(r["worker_anon"]) < WORKER_ANON_BOUND


@pytest.mark.parametrize("fmt", FORMATS_MEASURED)
def test_persistent_workers_do_not_grow_between_epochs(figures, fmt):
    for w, epochs in figures[fmt].items():
        e1, e2 = epochs[1], epochs[2]
        for a, b in zip(e1["worker_pss"], e2["worker_pss"]):
            assert b - a < EPOCH_GROWTH_BOUND, f"{fmt} workers={w}: a worker grew {(b - a) / MB:.1f} MB"
        assert e2["total_pss"] - e1["total_pss"] < EPOCH_GROWTH_BOUND, f"{fmt} workers={w}"


if __name__ == "__main__":  # the measurement, in a fresh process: ROOT... -> JSON on stdout
    result = {}
    for path in sys.argv[1:]:
        result[Path(path).name] = {str(w): measure(path, w) for w in WORKERS}
    print(json.dumps(result))
