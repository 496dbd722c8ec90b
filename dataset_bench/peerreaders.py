"""The older peers' readers: what a user would otherwise write or install, built the way their docs show.

Each ``make_*`` returns a fresh loader; ``workers`` worker processes, persistent and with
``prefetch_factor=2`` as ours, so steady rates compare the per-batch work, not worker start-up:

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

Their writers are in :mod:`dataset_bench.peerwriters`, the 2026 peers in :mod:`dataset_bench.newpeers`.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["folder_decoded", "folder_bytes", "memmap_pixels", "lmdb_bytes", "webdataset_loader",
           "lmdb_thread_pool", "ffcv_loader"]


def _loader(ds: Any, batch_size: int, workers: int, seed: int = 0, **kw: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader

    g = torch.Generator()
    g.manual_seed(seed)
    extra: dict[str, Any] = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return DataLoader(ds, batch_size=batch_size, shuffle=kw.pop("shuffle", True), num_workers=workers,
                      generator=g, **extra, **kw)


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
