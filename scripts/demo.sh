#!/usr/bin/env bash
# Quickstart command 1: set up, then pack the bundled real photos
# (examples/real-images, 31 images in 6 classes) into all four formats,
# verify each output and read a batch back through make_loader.
set -euo pipefail
cd "$(dirname "$0")/.."
# DATASET_PACKER_DEMO_SETUP=0: run in the current environment (tests/test_readme.py compares the output with the README)
if [ "${DATASET_PACKER_DEMO_SETUP:-1}" != 0 ]; then
  bash scripts/setup.sh
  . .venv/bin/activate
fi
SRC=${1:-examples/real-images}
OUT=${2:-out/demo}
mkdir -p "$OUT"
for fmt in wds lmdb hdf5 mmap; do
  extra=()
  [ "$fmt" = mmap ] && extra=(--resize 256)
  [ "$fmt" = wds ] && extra=(--shard-size 4MB)
  pack-dataset "$SRC" --format "$fmt" -o "$OUT/$fmt" --overwrite "${extra[@]}"
  pack-dataset verify "$OUT/$fmt" --quiet
done
python - "$OUT" <<'PY'
import sys, time
from readers import open_dataset, make_loader
from readers.decode.transforms import imagenet_eval_transform

out = sys.argv[1]
for fmt in ("wds", "lmdb", "hdf5", "mmap"):
    ds = open_dataset(f"{out}/{fmt}", transform=imagenet_eval_transform() if fmt != "mmap" else None)
    loader = make_loader(ds, batch_size=8, num_workers=2)
    t0, n = time.perf_counter(), 0
    for images, labels in loader:
        n += len(labels)
    dt = time.perf_counter() - t0
    print(f"read {fmt:5s}: {n} samples in {dt:.2f} s, last batch {tuple(images.shape)} {images.dtype}, "
          f"labels {labels.tolist()}, classes {ds.classes}")
PY
