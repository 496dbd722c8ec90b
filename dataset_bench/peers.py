"""The peers: what a user would otherwise write or install, built the way their docs show.

Readers (each ``make_*`` returns a fresh loader; ``workers`` worker processes,
persistent and with ``prefetch_factor=2`` as ours, so steady rates compare
the per-batch work, not worker start-up):

* :func:`folder_decoded` -- the naive folder: PIL per file, resize 256,
  center crop 224, float tensor (``dataset_bench.naive``);
* :func:`folder_bytes` -- the folder's files as ``bytes``;
* :func:`memmap_pixels` -- a naive ``np.memmap`` Dataset over the same
  ``images.npy`` our ``mmap`` format wrote: one contiguous copy per sample
  (``np.array(arr[i])``, or of its center crop), ``default_collate`` stacks them;
* :func:`lmdb_bytes` -- LMDB by hand: ``txn.get`` per sample;
* :func:`webdataset_loader` -- the official ``webdataset`` reader over our shards;
* :func:`lmdb_thread_pool` -- a plain thread-pool loader over the same LMDB
  (the ceiling a thread-based loader can reach in Python when FFCV is absent);
* :func:`ffcv_loader` -- FFCV's own loader (threads + numba), when ``ffcv`` imports.
* the 2026 peers (:data:`NEW_PEERS`, each optional, each possibly in its own venv):
  :func:`dali_loader` (DALI, CPU only, over our shards), :func:`spdl_loader` (SPDL's thread
  pipeline over the folder), :func:`grain_loader` (Grain over ArrayRecord), :func:`lance_loader`
  (Lance's torch dataset) and :func:`energon_loader` (Megatron-Energon over our shards), with
  their writers :func:`write_array_record`, :func:`write_lance` and :func:`prepare_energon`.

Writers (one call packs ``files`` with ``labels`` into ``out``):
:func:`write_lmdb`, :func:`write_shardwriter` (``webdataset.ShardWriter``),
:func:`write_mds` (mosaicml-streaming's ``MDSWriter``, when installed) and
:func:`write_ffcv` (the FFCV files the FFCV readers need).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import io
import os
import queue
import sys
import threading
import types
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

__all__ = ["folder_decoded", "folder_bytes", "memmap_pixels", "lmdb_bytes", "webdataset_loader",
           "lmdb_thread_pool", "ffcv_loader", "write_lmdb", "write_shardwriter", "write_mds", "write_ffcv",
           "available", "import_streaming", "NEW_PEERS", "NewPeer", "installed", "dali_loader", "spdl_loader",
           "grain_loader", "lance_loader", "energon_loader", "write_array_record", "write_lance", "prepare_energon"]


def _loader(ds: Any, batch_size: int, workers: int, seed: int = 0, **kw: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader

    g = torch.Generator()
    g.manual_seed(seed)
    extra: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return DataLoader(ds, batch_size=batch_size, shuffle=kw.pop("shuffle", True), num_workers=workers,
                      generator=g, **extra, **kw)


# --------------------------------------------------------------------------- readers


def folder_decoded(src: str | os.PathLike, batch_size: int, workers: int) -> Any:
    """The naive folder (``dataset_bench.naive.NaiveImageFolder``), persistent workers."""
    from dataset_bench.naive import NaiveImageFolder

    return _loader(NaiveImageFolder(src), batch_size, workers)


class _FolderBytes:
    def __init__(self, src: str | os.PathLike) -> None:
        from dataset_bench.naive import NaiveImageFolder

        ds = NaiveImageFolder(src)
        self.files, self.labels = ds.files, ds.labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        with open(self.files[i], "rb") as f:
            return f.read(), self.labels[i]


def folder_bytes(src: str | os.PathLike, batch_size: int, workers: int) -> Any:
    """Each file's bytes, default collate (a list of ``bytes`` per batch)."""
    return _loader(_FolderBytes(src), batch_size, workers)


class _NaiveMemmap:
    """``np.load(mmap_mode="r")`` once per process; a sample is one contiguous copy of its HWC row, or
    of its center ``crop`` x ``crop`` (numpy slicing, the way one writes it by hand)."""

    def __init__(self, npy: str | os.PathLike, labels: np.ndarray, crop: int | None = None) -> None:
        self.npy, self.labels, self.crop = str(npy), labels, crop
        self._arr: Any = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        if self._pid != os.getpid():
            self._arr, self._pid = np.load(self.npy, mmap_mode="r"), os.getpid()
        row = self._arr[i]
        if self.crop is not None:
            top, left = (row.shape[0] - self.crop) // 2, (row.shape[1] - self.crop) // 2
            row = row[top:top + self.crop, left:left + self.crop]
        return torch.from_numpy(np.array(row)), int(self.labels[i])


def memmap_pixels(npy: str | os.PathLike, labels: np.ndarray, batch_size: int, workers: int,
                  crop: int | None = None) -> Any:
    """The naive ``np.memmap`` Dataset: (H, W, 3) uint8 per sample (its center ``crop`` x ``crop`` when
    given), ``default_collate`` stacks."""
    return _loader(_NaiveMemmap(npy, labels, crop), batch_size, workers)


class _LmdbByHand:
    def __init__(self, root: str | os.PathLike, labels: np.ndarray, key: Any) -> None:
        self.root, self.labels, self.key = str(root), labels, key
        self._env: Any = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def _open(self) -> Any:
        import lmdb

        if self._pid != os.getpid():
            self._env = lmdb.open(self.root, readonly=True, lock=False, readahead=True, subdir=True)
            self._pid = os.getpid()
        return self._env

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        with self._open().begin() as txn:
            return txn.get(self.key(i)), int(self.labels[i])

    def close(self) -> None:
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = self._pid = None


def lmdb_bytes(root: str | os.PathLike, labels: np.ndarray, batch_size: int, workers: int) -> Any:
    """LMDB by hand (the same ``data.mdb``): one read transaction and ``txn.get`` per sample."""
    from readers.contract.spec import lmdb_key

    return _loader(_LmdbByHand(root, labels, lmdb_key), batch_size, workers)


def _wds_eval(sample: tuple[bytes, Any]) -> tuple[Any, int]:
    from dataset_bench.measure import eval_transform

    data, label = sample
    return eval_transform()(data), int(label)


def webdataset_loader(shards: Sequence[str], batch_size: int, workers: int, decode: bool) -> Any:
    """The official reader over our shards, as its README feeds a DataLoader (batched in the workers)."""
    import torch
    import webdataset as wds

    ds = wds.WebDataset(list(shards), shardshuffle=False, empty_check=False).shuffle(1000).to_tuple("jpg;png", "cls")
    if decode:
        ds = ds.map(_wds_eval)
    kw: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return torch.utils.data.DataLoader(ds.batched(batch_size, partial=True), batch_size=None,
                                       num_workers=workers, **kw)


class _ThreadPoolLoader:
    """A plain thread-pool loader: thread ``w`` reads batches ``w, w+T, ...`` (``txn.get`` into
    ``bytes``), batches come out in order. No collate, no checks: the floor of Python overhead."""

    def __init__(self, root: str, n: int, batch_size: int, threads: int) -> None:
        self.root, self.n, self.batch_size, self.num_workers = root, n, batch_size, threads
        self._env: Any = None
        self.epoch = 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def _read(self, idx: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        from readers.contract.spec import lmdb_key

        with self._env.begin() as txn:
            return [txn.get(lmdb_key(int(i))) for i in idx], idx

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def __iter__(self) -> Iterator[tuple[list[bytes], np.ndarray]]:
        import lmdb

        if self._env is None:
            self._env = lmdb.open(self.root, readonly=True, lock=False, readahead=True, subdir=True)
        order = np.random.default_rng([0, self.epoch]).permutation(self.n)
        self.epoch += 1
        batches = [order[i:i + self.batch_size] for i in range(0, self.n, self.batch_size)]
        qs: list[queue.Queue[Any]] = [queue.Queue(maxsize=2) for _ in range(self.num_workers)]

        def work(w: int) -> None:
            for b in batches[w::self.num_workers]:
                qs[w].put(self._read(b))

        threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(self.num_workers)]
        for t in threads:
            t.start()
        for k in range(len(batches)):
            yield qs[k % self.num_workers].get()
        for t in threads:
            t.join()


def lmdb_thread_pool(root: str | os.PathLike, n: int, batch_size: int, threads: int) -> Any:
    """:class:`_ThreadPoolLoader` over an LMDB written by ``pack-dataset --format lmdb``."""
    return _ThreadPoolLoader(str(root), n, batch_size, max(1, threads))


def ffcv_loader(beton: str | os.PathLike, batch_size: int, workers: int, decoded: bool) -> Any:
    """FFCV's loader (``num_workers`` threads): the stored bytes (``BytesDecoder``) or its center-crop
    JPEG decoder to 224x224 (ratio 224/256, the eval recipe) as uint8 NCHW tensors."""
    from ffcv.fields.decoders import BytesDecoder, CenterCropRGBImageDecoder, IntDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor, ToTorchImage

    if decoded:
        pipes = {"image": [CenterCropRGBImageDecoder((224, 224), 224 / 256), ToTensor(), ToTorchImage()],
                 "label": [IntDecoder()]}
    else:
        pipes = {"data": [BytesDecoder()], "label": [IntDecoder()]}
    return Loader(str(beton), batch_size=batch_size, num_workers=max(1, workers), order=OrderOption.RANDOM,
                  pipelines=pipes, os_cache=True, drop_last=False, seed=0)


# --------------------------------------------------------------------------- writers


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


def import_streaming() -> types.ModuleType:
    """``import streaming`` (mosaicml-streaming). Its package imports ``torchvision`` for its vision
    datasets at import time; where torchvision cannot load beside the installed torch (PyPI's
    torchvision against a CPU build of torch), stand-ins for the two names it imports are put in
    its place. MDSWriter, the only part used here, never touches them."""
    try:
        return importlib.import_module("streaming")
    except (ImportError, RuntimeError):
        pass
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]

    def stub(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    class VisionDataset:  # never instantiated here
        pass

    def to_tensor(*_a: Any, **_k: Any) -> Any:
        raise NotImplementedError("torchvision is not usable in this environment")

    functional = stub("torchvision.transforms.functional", to_tensor=to_tensor)
    stub("torchvision", datasets=stub("torchvision.datasets", VisionDataset=VisionDataset, CIFAR10=VisionDataset),
         transforms=stub("torchvision.transforms", functional=functional))
    return importlib.import_module("streaming")


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


def available(name: str) -> str | None:
    """None when the optional peer ``name`` ("ffcv", "streaming") can be used here, else why not."""
    try:
        if name == "streaming":
            import_streaming()
        else:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable here", said in the report
        from readers.contract.messages import one_line

        return one_line(exc, 160, kind=True, first=True)
    return None


# --------------------------------------------------------------------------- the 2026 peers
#
# Each is optional and may live in its own venv (numpy pins): ``installed`` answers for any
# interpreter, and the bench runs the peer's preparation and measurements in that interpreter
# (``dataset_bench.isolate.run_isolated(..., python=...)``). Every loader below yields, per batch,
# ``(data, labels)``: ``data`` a list of ``bytes`` (bytes mode) or one uint8 array/tensor of the
# batch's 224x224 RGB images (decoded mode, the peers' own resize 256 + center crop 224), ``labels``
# a list of ints; one iteration is one epoch.


class NewPeer(NamedTuple):
    """One 2026 peer: the modules that must import, its pip install line, its modes, its workers' kind."""

    modules: tuple[str, ...]
    pip: str
    modes: tuple[str, ...]
    kind: str  # threads | processes


NEW_PEERS: dict[str, NewPeer] = {
    "dali": NewPeer(("nvidia.dali",), "nvidia-dali-cuda120", ("bytes", "decoded"), "threads"),
    "spdl": NewPeer(("spdl.pipeline", "spdl.io"), "spdl", ("bytes", "decoded"), "threads"),
    "grain": NewPeer(("grain", "array_record"), "grain array-record", ("bytes", "decoded"), "processes"),
    "lance": NewPeer(("lance",), "pylance", ("bytes", "decoded"), "processes"),
    "energon": NewPeer(("megatron.energon",), "megatron-energon", ("bytes", "decoded"), "processes"),
}

_FIND = ("import importlib.util, sys\n"
         "def found(m):\n"
         "    try:\n"
         "        return importlib.util.find_spec(m) is not None\n"
         "    except ImportError:\n"
         "        return False\n"
         "sys.exit(0 if all(found(m) for m in sys.argv[1:]) else 3)\n")


def installed(name: str, python: str | None = None) -> str | None:
    """None when the 2026 peer ``name`` is installed for ``python`` (default: this interpreter), else
    the one line the run prints in its place."""
    peer = NEW_PEERS[name]
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):  # a venv python is a symlink
        if not os.access(python, os.X_OK):
            return f"peer {name} skipped: {python} is not an executable Python"
        import subprocess

        ok = subprocess.run([python, "-c", _FIND, *peer.modules], capture_output=True, check=False).returncode == 0
    else:
        ok = all(_found(m) for m in peer.modules)
    return None if ok else f"peer {name} skipped: not installed (pip install {peer.pip})"


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing
        return False


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
