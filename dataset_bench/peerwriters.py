"""The older peers' writers: one call packs ``files`` with ``labels`` into ``out``, the way their docs show.

:func:`write_lmdb` (LMDB by hand), :func:`write_shardwriter` (``webdataset.ShardWriter``),
:func:`write_mds` (mosaicml-streaming's ``MDSWriter``, when installed) and :func:`write_ffcv` (the FFCV
files the FFCV readers of :mod:`dataset_bench.peerreaders` need).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dataset_bench.peers import import_streaming

__all__ = ["write_lmdb", "write_shardwriter", "write_mds", "write_ffcv"]


def write_lmdb(files: Sequence[str], labels: Sequence[int], out: str | os.PathLike, txn_every: int = 1000) -> None:
    """LMDB by hand: one put per file (the labels as one more value), commit every ``txn_every``."""
    import lmdb

    from readers.contract.spec import lmdb_key

    total = sum(os.path.getsize(f) for f in files)
    env = lmdb.open(str(out), map_size=2 * total + (1 << 30), subdir=True)
    txn = env.begin(write=True)
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            txn.put(lmdb_key(i), fh.read())
        if (i + 1) % txn_every == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.put(b"__labels__", np.asarray(labels, dtype=np.int64).tobytes())
    txn.commit()
    env.close()


def write_shardwriter(files: Sequence[str], labels: Sequence[int], out: str | os.PathLike) -> None:
    """``webdataset.ShardWriter``, 256 MB shards, as its README writes an image folder."""
    import webdataset as wds

    Path(out).mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(Path(out) / "shard-%06d.tar"), maxsize=256e6, verbose=0) as sink:
        for i, (f, label) in enumerate(zip(files, labels)):
            with open(f, "rb") as fh:
                sink.write({"__key__": f"{i:010d}", "jpg": fh.read(), "cls": int(label)})


def write_mds(files: Sequence[str], labels: Sequence[int], out: str | os.PathLike) -> None:
    """mosaicml-streaming's ``MDSWriter``: columns ``jpg`` (bytes) and ``cls`` (int), no compression."""
    streaming = import_streaming()
    with streaming.MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit="256mb",
                             progress_bar=False) as w:
        for f, label in zip(files, labels):
            with open(f, "rb") as fh:
                w.write({"jpg": fh.read(), "cls": int(label)})


class _FfcvBytes:
    def __init__(self, files: Sequence[str], labels: Sequence[int]) -> None:
        self.files, self.labels = list(files), list(labels)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        with open(self.files[i], "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8), int(self.labels[i])


class _FfcvImages(_FfcvBytes):
    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        with open(self.files[i], "rb") as f:
            return Image.open(io.BytesIO(f.read())).convert("RGB"), int(self.labels[i])


def write_ffcv(files: Sequence[str], labels: Sequence[int], out_dir: str | os.PathLike,
               workers: int = 2) -> dict[str, Path]:
    """The two FFCV files the FFCV readers use: ``bytes.beton`` (the JPEG files as ``BytesField``)
    and ``images.beton`` (``RGBImageField`` in its ``jpg`` mode, quality 90, FFCV's own encoding)."""
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    out = {"bytes": Path(out_dir) / "bytes.beton", "decoded": Path(out_dir) / "images.beton"}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    DatasetWriter(str(out["bytes"]), {"data": BytesField(), "label": IntField()},
                  num_workers=workers).from_indexed_dataset(_FfcvBytes(files, labels))
    DatasetWriter(str(out["decoded"]), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                        "label": IntField()},
                  num_workers=workers).from_indexed_dataset(_FfcvImages(files, labels))
    return out
