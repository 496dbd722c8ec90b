"""One measurement of a side-by-side run, each run in its own process: a read case
(:func:`measure_read`), a pack (:func:`measure_pack`), a 2026 peer's preparation
(:func:`prepare_peer`) and its one-epoch check against the folder (:func:`peer_samples`,
:func:`same_samples`). The cases: :mod:`dataset_bench.sidecases`; the run:
:mod:`dataset_bench.sidebyside`.
"""

from __future__ import annotations

import hashlib
import importlib
import resource
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from dataset_bench.measure import batch_len
from dataset_bench.peers import NEW_PEERS
from dataset_bench.sidecases import CROP, DEFAULTS, MODES, ReadCase

__all__ = ["measure_read", "measure_pack", "our_dataset", "chosen_workers", "sample_key", "peer_samples",
           "folder_samples", "same_samples", "prepare_peer", "DECODED_SHAPES"]


# --------------------------------------------------------------------------- one read case


def _make_loader(case: ReadCase, paths: dict[str, Any], batch_size: int) -> Callable[[], Any]:
    from dataset_bench import newpeers, peerreaders

    n = case.workers
    if case.who == "peer":
        makers: dict[tuple[str, str], Callable[[], Any]] = {
            ("memmap", "pixels"): lambda: peerreaders.memmap_pixels(paths["npy"], paths["labels"], batch_size, n),
            ("memmap", "raw224"): lambda: peerreaders.memmap_pixels(paths["npy"], paths["labels"], batch_size, n,
                                                                    CROP),
            ("folder", "bytes"): lambda: peerreaders.folder_bytes(paths["src"], batch_size, n),
            ("folder", "decoded"): lambda: peerreaders.folder_decoded(paths["src"], batch_size, n),
            ("lmdb", "bytes"): lambda: peerreaders.lmdb_bytes(paths["lmdb"], paths["labels"], batch_size, n),
            ("webdataset", "bytes"): lambda: peerreaders.webdataset_loader(paths["shards"], batch_size, n, False),
            ("webdataset", "decoded"): lambda: peerreaders.webdataset_loader(paths["shards"], batch_size, n, True),
            ("threadpool", "bytes"): lambda: peerreaders.lmdb_thread_pool(paths["lmdb"], len(paths["labels"]),
                                                                         batch_size, n),
            ("ffcv", "bytes"): lambda: peerreaders.ffcv_loader(paths["ffcv"]["bytes"], batch_size, n, False),
            ("ffcv", "decoded"): lambda: peerreaders.ffcv_loader(paths["ffcv"]["decoded"], batch_size, n, True),
        }
        decoded = case.mode == "decoded"
        prepared = paths.get("peer", {}).get(case.name)
        makers.update({
            ("dali", case.mode): lambda: newpeers.dali_loader(paths["shards"], len(paths["labels"]), batch_size, n,
                                                              decoded),
            ("spdl", case.mode): lambda: newpeers.spdl_loader(paths["files"], paths["labels"], batch_size, n,
                                                              decoded),
            ("grain", case.mode): lambda: newpeers.grain_loader(prepared, batch_size, n, decoded),
            ("lance", case.mode): lambda: newpeers.lance_loader(prepared, batch_size, n, decoded),
            ("energon", case.mode): lambda: newpeers.energon_loader(prepared, batch_size, n, decoded),
        })
        return makers[(case.name, case.mode)]

    def ours() -> Any:
        from readers import make_loader

        ds = our_dataset(case.name, case.mode, paths)
        kind = {} if case.kind == DEFAULTS else {"workers": case.kind}  # defaults: no workers= at all
        return make_loader(ds, batch_size=batch_size, num_workers=n, pin_memory=False, **kind)

    return ours


def our_dataset(name: str, mode: str, paths: dict[str, Any]) -> Any:
    """Our reader of format ``name`` opened for ``mode`` (see :data:`dataset_bench.sidecases.MODES`), as a
    user opens it."""
    from dataset_bench.measure import eval_transform
    from dataset_bench.naive import PilEvalTransform
    from readers import open_dataset
    from readers.decode.transforms import imagenet_train_transform

    root = paths["packed"][name]
    if mode == "bytes":
        return open_dataset(root, decode=False)
    if mode == "pixels":
        return open_dataset(root)
    if mode == "raw224":  # shorter side to the stored size (nothing to resize), then the center crop
        return open_dataset(root, transform=eval_transform(size=CROP, resize=int(paths["mmap_size"])))
    if mode == "decoded":
        return open_dataset(root, transform=eval_transform(size=CROP))
    if mode == "train":
        return open_dataset(root, transform=imagenet_train_transform(size=CROP, seed=0))
    if mode == "pil":
        return open_dataset(root, image="pil", transform=PilEvalTransform(crop=CROP))
    raise ValueError(f"unknown read mode {mode!r} (one of {', '.join(MODES)})")


def chosen_workers(loader: Any) -> str:
    """What a loader of ours runs its workers as: ``threads`` (a :class:`readers.loader.dataloader.ThreadLoader`),
    ``processes``, or ``main`` (no workers: batches made in the calling thread). Read from the loader
    ``make_loader`` returned, so it holds whatever the library picks when ``workers=`` is not given."""
    from readers.loader.dataloader import ThreadLoader

    if not getattr(loader, "num_workers", 0):
        return "main"
    return "threads" if isinstance(loader, ThreadLoader) else "processes"


def _data_folder(case: ReadCase, paths: dict[str, Any]) -> str | None:
    if case.who == "ours":
        return str(paths["packed"][case.name])
    if case.name in NEW_PEERS:
        prepared = paths.get("peer", {}).get(case.name)
        return str(Path(prepared).parent if Path(prepared).is_file() else prepared) if prepared else \
            str(Path(paths["shards"][0]).parent) if case.name == "dali" else paths["src"]
    return {"memmap": str(Path(paths["npy"]).parent), "lmdb": str(paths["lmdb"]),
            "threadpool": str(paths["lmdb"]), "ffcv": str(Path(paths["ffcv"]["bytes"]).parent)
            if paths.get("ffcv") else None}.get(case.name)


def measure_read(case: tuple, paths: dict[str, Any], batch_size: int, warmup: int,
                 min_seconds: float) -> dict[str, Any]:
    """Build the case's loader, draw ``warmup`` batches, then time batches (over as many passes as
    it takes) until ``min_seconds`` have passed. Runs in its own process."""
    from dataset_bench.memory import PrivatePeak

    case = ReadCase(*case)
    t0 = time.perf_counter()
    loader = _make_loader(case, paths, batch_size)()
    chosen = chosen_workers(loader) if case.who == "ours" else None
    mem = PrivatePeak(_data_folder(case, paths))
    drawn, samples, start, first = 0, 0, None, None
    passes, done = 0, False
    try:
        while passes < 1000 and not done:
            passes += 1
            for batch in loader:
                now = time.perf_counter()
                first = first if first is not None else now - t0
                drawn += 1
                if start is None:
                    if drawn >= warmup:
                        start = now
                    continue
                samples += batch_len(batch)
                mem.sample(now)
                if now - start >= min_seconds:
                    done = True
                    break
        end = time.perf_counter()
        mem.sample(end, force=True)
    finally:
        _close(loader)
    seconds = end - start if start is not None else 0.0
    return {"samples_per_s": samples / seconds if seconds > 0 else 0.0, "samples": samples, "seconds": seconds,
            "passes": passes, "first_batch_s": first, "chosen": chosen,
            "private_mb": None if mem.private is None else mem.private / 1e6, "mapped_mb": mem.mapped / 1e6}


def _close(loader: Any) -> None:
    it = getattr(loader, "_iterator", None)
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()
    for obj in (getattr(loader, "dataset", None), loader):
        close = getattr(obj, "close", None)
        if callable(close):
            close()


# --------------------------------------------------------------------------- the 2026 peers: same samples

DECODED_SHAPES = ("uint8:3x224x224", "uint8:224x224x3")  # what a decoded sample may be (CHW or HWC)


def sample_key(data: Any, mode: str) -> str:
    """What :func:`same_samples` compares of one sample: the SHA-1 of its bytes (bytes mode), or its
    dtype and shape (decoded mode: the count and labels are compared, the pixels differ by decoder)."""
    if mode == "bytes":
        return hashlib.sha1(bytes(data)).hexdigest()
    return f"{str(data.dtype).replace('torch.', '')}:{'x'.join(str(int(d)) for d in data.shape)}"


def peer_samples(case: tuple, paths: dict[str, Any], batch_size: int) -> list[tuple[str, int]]:
    """One epoch of the case's loader: ``(sample_key, label)`` per sample. Runs in the peer's process."""
    case = ReadCase(*case)
    loader = _make_loader(case, paths, batch_size)()
    try:
        return [(sample_key(d, case.mode), int(lab)) for data, labels in loader for d, lab in zip(data, labels)]
    finally:
        _close(loader)


def folder_samples(files: Sequence[str], labels: Sequence[int]) -> list[tuple[str, int]]:
    """The folder's own ``(SHA-1 of the file, label)`` per sample: what a bytes-mode peer must return."""
    out = []
    for f, lab in zip(files, labels):
        with open(f, "rb") as fh:
            out.append((hashlib.sha1(fh.read()).hexdigest(), int(lab)))
    return out


def same_samples(got: Sequence[tuple[str, int]], want: Sequence[tuple[str, int]], mode: str) -> str | None:
    """None when one epoch of a peer (``got``, from :func:`peer_samples`) returned the folder's samples
    (``want``, :func:`folder_samples`): as many, the same label multiset, and in bytes mode the same
    (bytes, label) multiset; in decoded mode every sample a 224x224 RGB uint8 image. Else what differs."""
    if len(got) != len(want):
        return f"{len(got)} samples in one epoch, the folder has {len(want)}"
    got_labels, want_labels = Counter(lab for _, lab in got), Counter(lab for _, lab in want)
    if got_labels != want_labels:
        diff = sorted(set(got_labels) | set(want_labels), key=lambda k: (got_labels[k] == want_labels[k], k))[0]
        return f"labels differ from the folder's: label {diff} {got_labels[diff]} times, the folder {want_labels[diff]}"
    if mode == "bytes":
        missing = Counter(want) - Counter(got)
        if missing:
            return f"{sum(missing.values())} of {len(want)} samples are not the folder's (bytes or label differ)"
        return None
    wrong = Counter(k for k, _ in got if k not in DECODED_SHAPES)
    if wrong:
        key, count = wrong.most_common(1)[0]
        return f"{count} samples are {key}, not a 224x224 RGB uint8 image"
    return None


def prepare_peer(name: str, files: Sequence[str], labels: Sequence[int], shards: Sequence[str],
                 out: str) -> str | None:
    """Write what the 2026 peer ``name`` reads (in its own interpreter); its path, or None when it reads
    the folder (SPDL) or our shards as they are (DALI)."""
    from dataset_bench import newpeers

    if name == "grain":
        return newpeers.write_array_record(files, labels, out)
    if name == "lance":
        return newpeers.write_lance(files, labels, out)
    if name == "energon":
        return newpeers.prepare_energon(shards, out)
    return None


# --------------------------------------------------------------------------- one pack case


def measure_pack(name: str, src: str, out: str, validate: bool, workers: int, warmup: bool = True) -> dict[str, Any]:
    """Pack ``src`` into ``out`` with packer ``name`` (one of :data:`dataset_bench.sidecases.PACKERS`);
    images/s of the call.

    ``warmup``: the same pack runs once first, untimed, and its output is removed; the timed run
    follows at once in this process. Reads are timed on a warm page cache; this is the write side of
    that. On a VM that hands freed memory back to its host (the machine of this project's
    figures), a cold pack pays first-touch faults on whatever memory it draws: single cold runs of
    LMDB by hand measured 4.8k-12.9k images/s there, warm ones 12.2-12.4k.
    """
    from dataset_bench import peerwriters
    from dataset_bench.naive import NaiveImageFolder
    from dataset_bench.peers import import_streaming

    who, what = name.split(":")
    folder = NaiveImageFolder(src)
    # Imports are not part of the timing: the writer's modules (and what they pull in) load first.
    if what == "mds":
        import_streaming()
    elif who == "ours":
        importlib.import_module("packer.api")
        importlib.import_module(f"packer.formats.{what}")
    else:
        importlib.import_module({"lmdb": "lmdb", "shardwriter": "webdataset"}[what])

    def run() -> float:
        t0 = time.perf_counter()
        if who == "ours":
            from packer import PackOptions, pack

            pack(src, out, PackOptions(format=what, workers=workers, validate=validate, overwrite=True))
        else:
            writer = {"lmdb": peerwriters.write_lmdb, "shardwriter": peerwriters.write_shardwriter,
                      "mds": peerwriters.write_mds}[what]
            writer(folder.files, folder.labels, out)
        return time.perf_counter() - t0

    if warmup:
        run()
        shutil.rmtree(out, ignore_errors=True)
    cpu0 = _cpu_seconds()
    seconds = run()
    cpu = _cpu_seconds() - cpu0
    return {"images_per_s": len(folder) / seconds, "seconds": seconds, "images": len(folder),
            "cpu_us_per_image": 1e6 * cpu / len(folder)}


def _cpu_seconds() -> float:
    """User + system CPU time of this process's threads and of its children that have ended (a pack's
    worker pool is joined before ``pack()`` returns)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
