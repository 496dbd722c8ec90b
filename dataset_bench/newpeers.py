"""The 2026 peers' loaders and writers (the peers of :data:`dataset_bench.peers.NEW_PEERS`).

Loaders: :func:`dali_loader` (DALI, CPU only, over our shards), :func:`spdl_loader` (SPDL's thread
pipeline over the folder), :func:`grain_loader` (Grain over ArrayRecord), :func:`lance_loader`
(Lance's torch dataset) and :func:`energon_loader` (Megatron-Energon over our shards), with
their writers :func:`write_array_record`, :func:`write_lance` and :func:`prepare_energon`.

Each is optional and may live in its own venv (numpy pins): :func:`dataset_bench.peers.installed`
answers for any interpreter, and the bench runs the peer's preparation and measurements in that
interpreter (``dataset_bench.isolate.run_isolated(..., python=...)``). Every loader here yields, per
batch, ``(data, labels)``: ``data`` a list of ``bytes`` (bytes mode) or one uint8 array/tensor of the
batch's 224x224 RGB images (decoded mode, the peers' own resize 256 + center crop 224), ``labels``
a list of ints; one iteration is one epoch.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["dali_loader", "spdl_loader", "grain_loader", "lance_loader", "energon_loader", "write_array_record",
           "write_lance", "prepare_energon", "DaliLoader", "SpdlLoader", "GrainLoader", "EnergonLoader",
           "SPDL_FILTER"]


def _pil_eval(data: bytes) -> np.ndarray:
    """The peers' own transform where they have none: PIL, shorter side to 256, center crop 224, uint8 HWC."""
    from PIL import Image

    from readers.decode.geometry import resize_center_crop

    with Image.open(io.BytesIO(data)) as im:
        img = im.convert("RGB")
    g = resize_center_crop(img.height, img.width, 256, 224)
    return np.asarray(img.resize((g.width, g.height), Image.Resampling.BILINEAR).crop(g.box), dtype=np.uint8)


def _stack(images: Sequence[np.ndarray]) -> Any:
    import torch

    return torch.from_numpy(np.stack(images))


class _EpochLoader:
    """What the 2026 peers' loaders share: ``n`` samples, ``batch_size``, ``num_workers``, ``epoch``."""

    def __init__(self, n: int, batch_size: int, workers: int, decoded: bool) -> None:
        self.n, self.batch_size, self.num_workers, self.decoded, self.epoch = n, batch_size, workers, decoded, 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def _order(self) -> np.ndarray:
        order = np.random.default_rng([0, self.epoch]).permutation(self.n)
        self.epoch += 1
        return order

    def close(self) -> None:
        pass


# ---- NVIDIA DALI, CPU only: fn.readers.webdataset over our shards, CPU decoder, resize, crop


class DaliLoader(_EpochLoader):
    """A DALI pipeline with ``device_id=None`` (CPU operators only), ``num_threads`` = workers."""

    def __init__(self, shards: Sequence[str], n: int, batch_size: int, workers: int, decoded: bool) -> None:
        from nvidia.dali import fn, pipeline_def, types

        super().__init__(n, batch_size, workers, decoded)

        @pipeline_def(batch_size=batch_size, num_threads=max(1, workers), device_id=None, seed=0,
                      prefetch_queue_depth=2)
        def pipe() -> Any:
            data, cls = fn.readers.webdataset(paths=list(shards), ext=["jpg;png", "cls"], random_shuffle=True,
                                              pad_last_batch=True, missing_component_behavior="error",
                                              name="reader")
            if decoded:
                images = fn.decoders.image(data, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=256, interp_type=types.INTERP_LINEAR)
                data = fn.crop_mirror_normalize(images, crop=(224, 224), dtype=types.UINT8, output_layout="CHW")
            return data, cls

        self.pipe = pipe()
        self.pipe.build()

    def __iter__(self) -> Iterator[tuple[Any, list[int]]]:
        import torch

        left = self.n
        while left > 0:
            data, cls = self.pipe.run()
            k = min(left, len(cls))
            labels = [int(np.asarray(cls[i]).tobytes()) for i in range(k)]
            if self.decoded:
                out: Any = torch.from_numpy(np.asarray(data.as_tensor())[:k])
            else:
                out = [np.asarray(data[i]).tobytes() for i in range(k)]
            left -= k
            yield out, labels

    def close(self) -> None:
        self.pipe = None


def dali_loader(shards: Sequence[str], n: int, batch_size: int, workers: int, decoded: bool) -> DaliLoader:
    """:class:`DaliLoader` over our WebDataset shards."""
    return DaliLoader(shards, n, batch_size, workers, decoded)


# ---- SPDL: a thread pipeline over the folder's files; spdl.io decodes (FFmpeg filters resize + crop)

# shorter side to 256 (the other even, aspect kept), then the centered 224x224, as RGB
SPDL_FILTER = "scale=w='if(gt(iw,ih),-2,256)':h='if(gt(iw,ih),256,-2)',crop=224:224,format=pix_fmts=rgb24"


def _spdl_bytes(item: tuple[str, int]) -> tuple[bytes, int]:
    with open(item[0], "rb") as f:
        return f.read(), item[1]


def _spdl_decode(item: tuple[str, int]) -> tuple[np.ndarray, int]:
    import spdl.io

    packets = spdl.io.demux_image(item[0])
    frames = spdl.io.decode_packets(packets, filter_desc=SPDL_FILTER)
    return spdl.io.to_numpy(spdl.io.convert_frames(frames)), item[1]


class SpdlLoader(_EpochLoader):
    """``spdl.pipeline.PipelineBuilder``: source (shuffled paths) -> load/decode with ``workers``
    concurrent threads -> aggregate ``batch_size`` -> collate -> sink; one pipeline per epoch."""

    def __init__(self, files: Sequence[str], labels: Sequence[int], batch_size: int, workers: int,
                 decoded: bool) -> None:
        super().__init__(len(files), batch_size, workers, decoded)
        self.files, self.labels = list(files), [int(x) for x in labels]

    def _collate(self, items: list[tuple[Any, int]]) -> tuple[Any, list[int]]:
        data = [d for d, _ in items]
        return (_stack([d.reshape(224, 224, 3) for d in data]) if self.decoded else data), [lab for _, lab in items]

    def __iter__(self) -> Iterator[tuple[Any, list[int]]]:
        from spdl.pipeline import PipelineBuilder

        threads = max(1, self.num_workers)
        source = [(self.files[i], self.labels[i]) for i in self._order()]
        pipeline = (PipelineBuilder().add_source(source)
                    .pipe(_spdl_decode if self.decoded else _spdl_bytes, concurrency=threads)
                    .aggregate(self.batch_size).pipe(self._collate).add_sink(3).build(num_threads=threads))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=120)


def spdl_loader(files: Sequence[str], labels: Sequence[int], batch_size: int, workers: int,
                decoded: bool) -> SpdlLoader:
    """:class:`SpdlLoader` over the folder's files."""
    return SpdlLoader(files, labels, batch_size, workers, decoded)


# ---- Google Grain over ArrayRecord


def write_array_record(files: Sequence[str], labels: Sequence[int], out: str | os.PathLike) -> str:
    """One ArrayRecord file (``group_size:1``, random access), a record per image: pickled
    ``{"jpg": bytes, "cls": int}``."""
    import pickle

    from array_record.python.array_record_module import ArrayRecordWriter

    Path(out).mkdir(parents=True, exist_ok=True)
    path = str(Path(out) / "images.array_record")
    writer = ArrayRecordWriter(path, "group_size:1")
    try:
        for f, label in zip(files, labels):
            with open(f, "rb") as fh:
                writer.write(pickle.dumps({"jpg": fh.read(), "cls": int(label)}))
    finally:
        writer.close()
    return path


class _GrainParse:
    def __init__(self, decoded: bool) -> None:
        self.decoded = decoded

    def __call__(self, record: bytes) -> tuple[Any, int]:
        import pickle

        sample = pickle.loads(record)
        return (_pil_eval(sample["jpg"]) if self.decoded else sample["jpg"]), sample["cls"]


def _grain_batch(items: Sequence[tuple[Any, int]]) -> tuple[Any, list[int]]:
    data = [d for d, _ in items]
    return (_stack(data) if isinstance(data[0], np.ndarray) else data), [int(lab) for _, lab in items]


class GrainLoader(_EpochLoader):
    """Grain's dataset API over ``grain.sources.ArrayRecordDataSource``: ``MapDataset`` shuffled per
    epoch, a map that unpickles (and decodes), batches of ``batch_size``, then ``to_iter_dataset``
    (one read thread per process) and, with workers, ``mp_prefetch`` over ``workers`` processes."""

    def __init__(self, path: str, batch_size: int, workers: int, decoded: bool) -> None:
        import grain

        self._grain = grain
        self.source = grain.sources.ArrayRecordDataSource([path])
        super().__init__(len(self.source), batch_size, workers, decoded)

    def __iter__(self) -> Iterator[tuple[Any, list[int]]]:
        grain = self._grain
        ds = (grain.MapDataset.source(self.source).shuffle(seed=self.epoch).map(_GrainParse(self.decoded))
              .batch(self.batch_size, batch_fn=_grain_batch))
        self.epoch += 1
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
        if self.num_workers:
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.num_workers))
        yield from it


def grain_loader(path: str, batch_size: int, workers: int, decoded: bool) -> GrainLoader:
    """:class:`GrainLoader` over the ArrayRecord file :func:`write_array_record` wrote."""
    return GrainLoader(path, batch_size, workers, decoded)


# ---- Lance: a Lance dataset (image bytes + label), read through lance.torch.data


def write_lance(files: Sequence[str], labels: Sequence[int], out: str | os.PathLike) -> str:
    """``lance.write_dataset`` of a table ``image`` (binary, the JPEG file) and ``label`` (int64)."""
    import lance
    import pyarrow as pa

    blobs = []
    for f in files:
        with open(f, "rb") as fh:
            blobs.append(fh.read())
    path = str(Path(out) / "images.lance")
    lance.write_dataset(pa.table({"image": pa.array(blobs, pa.binary()),
                                  "label": pa.array([int(x) for x in labels], pa.int64())}), path,
                        mode="overwrite")  # a kept --work-dir: written again, as the other peers' files are
    return path


class _LanceCollate:
    def __init__(self, decoded: bool) -> None:
        self.decoded = decoded

    def __call__(self, rows: list[dict[str, Any]]) -> tuple[Any, list[int]]:
        data = [r["image"] for r in rows]
        return (_stack([_pil_eval(d) for d in data]) if self.decoded else data), [int(r["label"]) for r in rows]


def lance_loader(path: str, batch_size: int, workers: int, decoded: bool) -> Any:
    """``lance.torch.data.SafeLanceDataset`` (``take`` of each batch's rows) in the DataLoader of
    ``get_safe_loader`` (spawned workers, persistent), shuffled; the collate decodes in the workers."""
    from lance.torch.data import SafeLanceDataset, get_safe_loader

    ds = SafeLanceDataset(path)
    kw: dict[str, Any] = {"prefetch_factor": 2} if workers else {"persistent_workers": False,
                                                                   "multiprocessing_context": None}
    return get_safe_loader(ds, batch_size=batch_size, num_workers=workers, shuffle=True,
                           collate_fn=_LanceCollate(decoded), **kw)


# ---- Megatron-Energon over our WebDataset shards (its .nv-meta written by `energon prepare`)


def prepare_energon(shards: Sequence[str], out: str | os.PathLike) -> str:
    """Our shards linked into ``out``, then ``energon prepare`` there, non-interactive: every shard in
    the train split, sample type ``CrudeWebdataset`` (the members as they are)."""
    import shutil
    import subprocess

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        link = root / Path(shard).name
        if not link.exists():  # a kept --work-dir: prepared before, prepared again
            os.symlink(os.path.abspath(shard), link)
    energon = shutil.which("energon", path=os.path.dirname(sys.executable)) or "energon"
    proc = subprocess.run([energon, "prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0",
                           "--sample-type", "CrudeWebdataset", "--num-workers", "1", "--force-overwrite"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"energon prepare {root} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return str(root)


def _energon_cook(sample: dict[str, Any]) -> Any:
    """A crude sample (its members as stored) to an ``ImageClassificationSample`` holding the image's
    bytes, not decoded here (the task encoder decodes in decoded mode)."""
    from megatron.energon import ImageClassificationSample, basic_sample_keys

    data = sample["jpg"] if "jpg" in sample else sample["png"]
    return ImageClassificationSample(**basic_sample_keys(sample), image=bytes(data), label=int(bytes(sample["cls"])))


def _energon_encoder(decoded: bool) -> Any:
    """The task encoder for the crude samples: no decoder (the members' bytes as stored), a cooker to
    :func:`_energon_cook`'s samples, each to ``(bytes or decoded image, label)``, batches as the other peers'."""
    from megatron.energon import Cooker, DefaultTaskEncoder, stateless

    class Encoder(DefaultTaskEncoder):
        decoder = None
        cookers = [Cooker(stateless(_energon_cook))]

        def encode_sample(self, sample: Any) -> tuple[Any, int]:
            return (_pil_eval(sample.image) if decoded else sample.image), int(sample.label)

        def batch(self, samples: list[tuple[Any, int]]) -> tuple[Any, list[int]]:
            return _grain_batch(samples)

    return Encoder()


class EnergonLoader(_EpochLoader):
    """``get_loader(get_train_dataset(..., repeat=False))``: one shuffled epoch per iteration,
    ``WorkerConfig(num_workers=workers)`` (processes)."""

    def __init__(self, root: str, batch_size: int, workers: int, decoded: bool) -> None:
        from megatron.energon import WorkerConfig

        super().__init__(0, batch_size, workers, decoded)
        self.root, self.config = root, WorkerConfig(rank=0, world_size=1, num_workers=workers)

    def __iter__(self) -> Iterator[tuple[Any, list[int]]]:
        from megatron.energon import get_loader, get_train_dataset

        ds = get_train_dataset(self.root, worker_config=self.config, batch_size=self.batch_size,
                               shuffle_buffer_size=1000, max_samples_per_sequence=100, repeat=False,
                               task_encoder=_energon_encoder(self.decoded))
        yield from get_loader(ds)


def energon_loader(root: str, batch_size: int, workers: int, decoded: bool) -> EnergonLoader:
    """:class:`EnergonLoader` over the folder :func:`prepare_energon` prepared."""
    return EnergonLoader(root, batch_size, workers, decoded)
