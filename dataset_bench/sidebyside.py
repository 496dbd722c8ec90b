"""Side by side with the peers, in one run: reading, packing and memory, with each target's ratio.

One run generates ImageNet-like JPEGs (``dataset_bench.synth``), packs them into our
formats (``mmap`` at ``mmap_size`` so the naive ``np.memmap`` peer reads the
very same pixel file), writes what the peers need (FFCV files when ``ffcv``
imports), then measures, interleaved repeat by repeat so that load from
elsewhere hits every case alike:

* reading: every peer of :mod:`dataset_bench.peers` and every format of ours in every
  mode (:data:`MODES`) with 0 workers and with ``workers`` worker processes and threads, and
  with ``workers`` and ``make_loader``'s own choice of worker kind (kind ``defaults``: no
  ``workers=`` argument; the row's ``chosen`` says what the loader ran,
  :func:`chosen_workers`). Each case runs in a fresh interpreter: a
  loader is built, ``warmup`` batches are drawn, then batches are timed over
  as many passes as fill ``min_seconds``; peak private PSS (anonymous +
  shared memory, all the loader's processes) is sampled while it runs and
  the data files' mapped pages at the end (:mod:`dataset_bench.memory`);
* packing: ``pack()`` per format with validation on and off, against the
  plain writers of :mod:`dataset_bench.peers`; images/s of the whole call;
* the per-core decode ceiling: the eval transform on one core.

The 2026 peers (:data:`dataset_bench.peers.NEW_PEERS`: DALI CPU, SPDL, Grain over
ArrayRecord, Lance, Megatron-Energon) are each optional: a missing one is one line
``peer X skipped: not installed (pip install ...)``. One may live in its own venv
(``peer_pythons``: its preparation, check and measurements then run in that venv's
interpreter through :func:`dataset_bench.isolate.run_isolated`). Before one is timed, one
epoch of each of its modes is checked against the folder (:func:`same_samples`); a
mismatch or an error is one failure line and that mode is not timed.

Before each measurement the 1-minute load average is read and, around it, the
share of CPU time other processes took (:class:`dataset_bench.machine.CpuMonitor`);
both are kept with the figure. :func:`targets` turns the medians into the
issue's ratios with met / not met; :mod:`dataset_bench.sidereport` prints and draws.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import resource
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from collections import Counter
from typing import Any, Callable, NamedTuple, Sequence

from dataset_bench.machine import CpuMonitor, load_average, machine_info
from dataset_bench.measure import batch_len
from dataset_bench.peers import NEW_PEERS
from readers.contract.messages import one_line

__all__ = ["SideConfig", "ReadCase", "run_side_by_side", "measure_read", "measure_pack", "read_cases", "PACKERS",
           "same_samples", "peer_samples", "MODES", "DEFAULTS", "CROP", "our_dataset", "chosen_workers"]

FORMATS = ("wds", "lmdb", "hdf5")  # JPEG formats; mmap is measured as pixels
CROP = 224  # the output side of raw224, decoded, train and pil
DEFAULTS = "defaults"  # a ReadCase kind: make_loader without workers=, whatever the library picks
#: What a read case's loader delivers (ours; a peer does the same work its own way).
MODES = {
    "pixels": "mmap's stored pixels as they are (the naive np.memmap peer reads the same file)",
    "raw224": "mmap's stored pixels center-cropped to 224 by the readers' eval transform with resize = the "
              "stored size (ResizeCenterCrop(stored, 224): a center crop); the naive np.memmap peer slices "
              "the same crop in numpy",
    "bytes": "decode=False: the stored JPEG bytes",
    "decoded": "the readers' fused eval transform (resize 256, center crop 224, uint8 CHW); the peers their "
               "own eval recipe",
    "train": "the readers' fused train transform (RandomResizedCrop 224 + flip, uint8 CHW)",
    "pil": "a user's own PIL transform (naive.PilEvalTransform: resize 256, center crop 224, to float "
           "tensor) on decoded PIL images (image='pil'); its reference is the naive folder (decoded), the "
           "same per-image work after PIL opens the file",
}
PACKERS = ("ours:wds", "ours:lmdb", "ours:hdf5", "peer:lmdb", "peer:shardwriter", "peer:mds")


@dataclass(frozen=True)
class SideConfig:
    images: int = 5000
    repeats: int = 3
    # Packs are short (0.3-2 s) and single warm packs of the same writer vary by up to 2x from run to
    # run on the project's VM (LMDB by hand: 6.3k-12.5k images/s), so they get more repeats than reads.
    pack_repeats: int = 5
    batch_size: int = 64
    workers: int = 2  # the worker count compared (with 0)
    # mmap packed at this size (at least CROP: raw224 center-crops it); the naive memmap peer reads the same file
    mmap_size: int = 256
    min_seconds: float = 2.0  # timed part of each read case
    warmup: int = 4  # batches drawn before timing (worker start-up, JIT, first touches)
    pack: bool = True
    decoded: bool = True
    isolate: bool = True  # each measurement in a fresh interpreter
    # torch intra-op threads in each measuring process (None: torch's default, one per core). 1 by
    # default: with more, a 0-worker loader's torch ops (default_collate's stack, ToTensor) spin
    # against everything else on a busy machine and the peers' figures say more about the load
    # than about them (measured here at load 6: the naive memmap peer 101 vs 36,000 samples/s)
    torch_threads: int | None = 1
    seed: int = 0
    work_dir: str | None = None
    peers: tuple[str, ...] = ("ffcv", "streaming", *NEW_PEERS)  # optional peers to use when installed
    # (peer, python): run that 2026 peer in this interpreter (its own venv); others run in this one
    peer_pythons: tuple[tuple[str, str], ...] = ()

    @classmethod
    def quick(cls, **kw: Any) -> "SideConfig":
        """Seconds, for CI: a few images, one repeat, in-process; of the optional peers only the 2026
        ones, each where installed (a peer in another venv still runs in its own process)."""
        base: dict[str, Any] = dict(images=96, repeats=1, pack_repeats=1, batch_size=16, min_seconds=0.05, warmup=1, isolate=False,
                    peers=tuple(NEW_PEERS))
        base.update(kw)
        return cls(**base)

    def __post_init__(self) -> None:
        if self.mmap_size < CROP:
            raise ValueError(f"mmap_size {self.mmap_size}: raw224 center-crops the stored pixels to {CROP}, "
                             f"so they must be at least {CROP} a side")


class ReadCase(NamedTuple):
    """One read measurement: ``who`` (peer/ours), ``name``, ``mode`` (one of :data:`MODES`), worker
    count and kind."""

    who: str
    name: str
    mode: str
    workers: int
    kind: str = "processes"  # processes | threads | defaults (ours: make_loader picks)

    def label(self) -> str:
        kind = f" {self.kind}" if self.who == "ours" or self.workers else ""
        return f"{self.who}:{self.name} {self.mode} w={self.workers}{kind}"


def _new_peer_cases(have: dict[str, bool], mode: str, workers: int) -> list[ReadCase]:
    """The 2026 peers' cases of one mode: those whose check passed (``have["<peer>:<mode>"]``), with
    ``workers`` workers of their own kind (DALI / SPDL threads, the others processes)."""
    return [ReadCase("peer", name, mode, workers, peer.kind) for name, peer in NEW_PEERS.items()
            if have.get(f"{name}:{mode}")]


def read_cases(cfg: SideConfig, have: dict[str, bool]) -> list[ReadCase]:
    """Every read case of one repeat, peers first in each group. Ours with ``cfg.workers`` also run with
    ``make_loader``'s defaults (kind :data:`DEFAULTS`); raw224, train and pil with ``cfg.workers`` only,
    pil with the defaults only (what a user who brings a transform gets)."""
    w, kinds = cfg.workers, ("processes", "threads")  # with 0 workers: DataLoader vs ThreadLoader in this thread
    every = kinds + (DEFAULTS,)
    cases = []
    for n in (0, w):
        ours_kinds = every if n else kinds
        cases += [ReadCase("peer", "memmap", "pixels", n)]
        cases += [ReadCase("ours", "mmap", "pixels", n, k) for k in ours_kinds]
        cases += [ReadCase("peer", "folder", "bytes", n), ReadCase("peer", "lmdb", "bytes", n),
                  ReadCase("peer", "webdataset", "bytes", n)]
        if n and have.get("ffcv"):
            cases.append(ReadCase("peer", "ffcv", "bytes", n, "threads"))
        if n:
            cases.append(ReadCase("peer", "threadpool", "bytes", n, "threads"))
            cases += _new_peer_cases(have, "bytes", n)
        for fmt in FORMATS:
            cases += [ReadCase("ours", fmt, "bytes", n, k) for k in ours_kinds]
    cases += [ReadCase("peer", "memmap", "raw224", w)] + [ReadCase("ours", "mmap", "raw224", w, k) for k in every]
    if cfg.decoded:
        for n in (0, w):
            cases += [ReadCase("peer", "folder", "decoded", n), ReadCase("peer", "webdataset", "decoded", n)]
            if n and have.get("ffcv"):
                cases.append(ReadCase("peer", "ffcv", "decoded", n, "threads"))
            if n:
                cases += _new_peer_cases(have, "decoded", n)
            for fmt in FORMATS:
                cases += [ReadCase("ours", fmt, "decoded", n, k) for k in (every if n else ("processes",))]
        cases += [ReadCase("ours", fmt, "train", w, k) for fmt in FORMATS for k in every]
        cases += [ReadCase("ours", fmt, "pil", w, DEFAULTS) for fmt in FORMATS]
    return cases


# --------------------------------------------------------------------------- one read case


def _make_loader(case: ReadCase, paths: dict[str, Any], batch_size: int) -> Callable[[], Any]:
    from dataset_bench import peers

    n = case.workers
    if case.who == "peer":
        makers: dict[tuple[str, str], Callable[[], Any]] = {
            ("memmap", "pixels"): lambda: peers.memmap_pixels(paths["npy"], paths["labels"], batch_size, n),
            ("memmap", "raw224"): lambda: peers.memmap_pixels(paths["npy"], paths["labels"], batch_size, n, CROP),
            ("folder", "bytes"): lambda: peers.folder_bytes(paths["src"], batch_size, n),
            ("folder", "decoded"): lambda: peers.folder_decoded(paths["src"], batch_size, n),
            ("lmdb", "bytes"): lambda: peers.lmdb_bytes(paths["lmdb"], paths["labels"], batch_size, n),
            ("webdataset", "bytes"): lambda: peers.webdataset_loader(paths["shards"], batch_size, n, False),
            ("webdataset", "decoded"): lambda: peers.webdataset_loader(paths["shards"], batch_size, n, True),
            ("threadpool", "bytes"): lambda: peers.lmdb_thread_pool(paths["lmdb"], len(paths["labels"]),
                                                                   batch_size, n),
            ("ffcv", "bytes"): lambda: peers.ffcv_loader(paths["ffcv"]["bytes"], batch_size, n, False),
            ("ffcv", "decoded"): lambda: peers.ffcv_loader(paths["ffcv"]["decoded"], batch_size, n, True),
        }
        decoded = case.mode == "decoded"
        prepared = paths.get("peer", {}).get(case.name)
        makers.update({
            ("dali", case.mode): lambda: peers.dali_loader(paths["shards"], len(paths["labels"]), batch_size, n,
                                                           decoded),
            ("spdl", case.mode): lambda: peers.spdl_loader(paths["files"], paths["labels"], batch_size, n, decoded),
            ("grain", case.mode): lambda: peers.grain_loader(prepared, batch_size, n, decoded),
            ("lance", case.mode): lambda: peers.lance_loader(prepared, batch_size, n, decoded),
            ("energon", case.mode): lambda: peers.energon_loader(prepared, batch_size, n, decoded),
        })
        return makers[(case.name, case.mode)]

    def ours() -> Any:
        from readers import make_loader

        ds = our_dataset(case.name, case.mode, paths)
        kind = {} if case.kind == DEFAULTS else {"workers": case.kind}  # defaults: no workers= at all
        return make_loader(ds, batch_size=batch_size, num_workers=n, pin_memory=False, **kind)

    return ours


def our_dataset(name: str, mode: str, paths: dict[str, Any]) -> Any:
    """Our reader of format ``name`` opened for ``mode`` (see :data:`MODES`), as a user opens it."""
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
    from dataset_bench import peers

    if name == "grain":
        return peers.write_array_record(files, labels, out)
    if name == "lance":
        return peers.write_lance(files, labels, out)
    if name == "energon":
        return peers.prepare_energon(shards, out)
    return None


def _new_peers(cfg: SideConfig, work: Path, paths: dict[str, Any], have: dict[str, bool],
               lines: list[str], say: Callable[[str], None]) -> None:
    """Prepare and check each installed 2026 peer; ``have["<peer>:<mode>"]`` for each mode that passed,
    one failure line in ``lines`` for each that did not."""
    from dataset_bench.naive import NaiveImageFolder

    folder = NaiveImageFolder(paths["src"])
    paths["files"], paths["labels_list"] = list(map(str, folder.files)), [int(x) for x in folder.labels]
    want = folder_samples(folder.files, folder.labels)
    paths["peer"] = {}
    modes = ("bytes", "decoded") if cfg.decoded else ("bytes",)
    for name in NEW_PEERS:
        if not have.get(name):
            continue
        python = _python(cfg, name)
        try:
            say(f"peer {name}: prepare")
            paths["peer"][name] = _call(cfg, prepare_peer, {
                "name": name, "files": paths["files"], "labels": paths["labels_list"], "shards": paths["shards"],
                "out": str(work / f"peer-{name}")}, python=python, torch_threads=False)
        except Exception as exc:  # noqa: BLE001 - in this process or in its own, a peer's failure is its line
            lines.append(f"peer {name} failed: preparing its data: {_first_line(exc)}")
            continue
        for mode in NEW_PEERS[name].modes:
            if mode not in modes:
                continue
            say(f"peer {name}: check {mode}")
            try:
                got = _call(cfg, peer_samples, {"case": tuple(ReadCase("peer", name, mode, cfg.workers,
                                                                       NEW_PEERS[name].kind)),
                                                 "paths": _peer_paths(paths), "batch_size": cfg.batch_size},
                            python=python)
                why = same_samples(got, want, mode)
            except Exception as exc:  # noqa: BLE001 - as above: the line says what failed
                why = f"error: {_first_line(exc)}"
            if why is None:
                have[f"{name}:{mode}"] = True
            else:
                lines.append(f"peer {name} {mode} failed the same-samples check, not timed: {why}")


def _first_line(exc: BaseException) -> str:
    """The child's error (the last line of its message that names an exception), one line."""
    text = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
    picked = [ln.strip() for ln in text.splitlines() if "Error" in ln or "Exception" in ln]
    return picked[-1][:300] if picked else one_line(text or exc, 300, first=True)


def _python(cfg: SideConfig, name: str) -> str | None:
    """The interpreter peer ``name`` runs in: its entry in ``cfg.peer_pythons``, else this one (None)."""
    return dict(cfg.peer_pythons).get(name)


def _peer_paths(paths: dict[str, Any]) -> dict[str, Any]:
    """What a 2026 peer's process needs: plain lists only (its venv may have another numpy)."""
    return {"src": paths["src"], "shards": list(paths["shards"]), "files": paths["files"],
            "labels": paths["labels_list"], "peer": dict(paths["peer"])}


# --------------------------------------------------------------------------- one pack case


def measure_pack(name: str, src: str, out: str, validate: bool, workers: int, warmup: bool = True) -> dict[str, Any]:
    """Pack ``src`` into ``out`` with packer ``name`` (one of :data:`PACKERS`); images/s of the call.

    ``warmup``: the same pack runs once first, untimed, and its output is removed; the timed run
    follows at once in this process. Reads are timed on a warm page cache; this is the write side of
    that. On a VM that hands freed memory back to its host (the machine of this project's
    figures), a cold pack pays first-touch faults on whatever memory it draws: single cold runs of
    LMDB by hand measured 4.8k-12.9k images/s there, warm ones 12.2-12.4k.
    """
    from dataset_bench import peers
    from dataset_bench.naive import NaiveImageFolder

    who, what = name.split(":")
    folder = NaiveImageFolder(src)
    # Imports are not part of the timing: the writer's modules (and what they pull in) load first.
    if what == "mds":
        peers.import_streaming()
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
            {"lmdb": peers.write_lmdb, "shardwriter": peers.write_shardwriter, "mds": peers.write_mds}[what](
                folder.files, folder.labels, out)
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


# --------------------------------------------------------------------------- the run


def _prepare(cfg: SideConfig, work: Path, have: dict[str, bool], notes: list[str]) -> dict[str, Any]:
    from dataset_bench.synth import generate_image_folder
    from dataset_bench.targets import pack_formats
    from readers.contract import spec

    src = generate_image_folder(work / "images", cfg.images, seed=cfg.seed)
    packed = pack_formats(src, work / "packed", FORMATS + ("mmap",), mmap_resize=cfg.mmap_size,
                          shard_size=64 << 20)
    index = spec.read_index(packed["lmdb"])
    paths: dict[str, Any] = {"src": str(src), "packed": {k: str(v) for k, v in packed.items()},
                             "mmap_size": cfg.mmap_size,
                             "npy": str(Path(packed["mmap"]) / spec.DATA_FILE["mmap"]),
                             "labels": index.labels, "lmdb": str(packed["lmdb"]),
                             "shards": sorted(str(p) for p in Path(packed["wds"]).glob("*.tar"))}
    if have.get("ffcv"):
        from dataset_bench import peers
        from dataset_bench.naive import NaiveImageFolder

        folder = NaiveImageFolder(src)
        paths["ffcv"] = {k: str(v) for k, v in peers.write_ffcv(folder.files, folder.labels, work / "ffcv").items()}
        notes.append("FFCV reads its own files of the same images: bytes.beton (the JPEG files, BytesField) and "
                     "images.beton (RGBImageField jpg mode, quality 90: FFCV re-encodes)")
    return paths


def _warm(paths: dict[str, Any]) -> None:
    from dataset_bench.cache import CacheControl
    from dataset_bench.targets import dataset_target, folder_target

    files = folder_target(paths["src"]).files + [f for p in paths["packed"].values() for f in dataset_target(p).files]
    files += [Path(p) for p in (paths.get("ffcv") or {}).values()]
    for p in (paths.get("peer") or {}).values():
        if p:
            files += [p] if Path(p).is_file() else sorted(f for f in Path(p).rglob("*") if f.is_file())
    CacheControl.warm(files)


def _call(cfg: SideConfig, fn: Callable[..., Any], kwargs: dict[str, Any], *, python: str | None = None,
          torch_threads: int | None | bool = None) -> Any:
    """``fn(**kwargs)``: in a fresh interpreter when ``cfg.isolate`` or when ``python`` (another venv's)
    is given, else here; with ``cfg.torch_threads`` (``torch_threads=False``: torch's default)."""
    threads_wanted = cfg.torch_threads if torch_threads is None else (torch_threads or None)
    if cfg.isolate or python:
        from dataset_bench.isolate import run_isolated

        return run_isolated(fn, kwargs, torch_threads=threads_wanted, python=python)
    if not threads_wanted:
        return fn(**kwargs)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(threads_wanted)
    try:
        return fn(**kwargs)
    finally:
        torch.set_num_threads(threads)


def _validator() -> Callable[[bytes], Any]:
    from packer.prepare.images import ImageOptions, prepare_image

    opts = ImageOptions()
    return lambda data: prepare_image(data, opts)


def _train_transform() -> Callable[[bytes], Any]:
    from readers.decode.transforms import imagenet_train_transform

    return imagenet_train_transform(size=CROP, seed=0)


def _decode_ceiling(paths: dict[str, Any], n: int = 300) -> dict[str, float]:
    """Per core (images per CPU-second, over stored JPEGs in memory): the eval and train transforms,
    and the packer's validation of a JPEG kept as it is (every coefficient entropy-decoded)."""
    from dataset_bench.measure import eval_transform
    from dataset_bench.onecore import per_image_rates, single_core
    from readers import open_dataset

    ds = open_dataset(paths["packed"]["lmdb"], decode=False)
    blobs = [ds.read(i) for i in range(min(n, len(ds)))]
    with single_core():
        rate, check, train = per_image_rates([(eval_transform, blobs), (_validator, blobs),
                                              (_train_transform, blobs)], repeats=3)
    return {"eval_transform_per_core": rate["images_per_cpu_s"], "wall_per_core": rate["images_per_s"],
            "validate_per_core": check["images_per_cpu_s"], "train_transform_per_core": train["images_per_cpu_s"]}


def run_side_by_side(cfg: SideConfig | None = None, *, progress: Callable[[str], None] | None = None,
                     **kw: Any) -> dict[str, Any]:
    """The whole run; returns plain data (see :func:`dataset_bench.sidereport.report`)."""
    from dataset_bench import peers

    cfg = replace(cfg or SideConfig(), **kw) if kw or cfg is None else cfg
    say = progress or (lambda _s: None)
    notes: list[str] = []
    lines: list[str] = []  # one line per 2026 peer skipped, per mode that failed its check
    have = {}
    for name in ("ffcv", "streaming"):
        why = peers.available(name) if name in cfg.peers else "not asked for"
        have[name] = why is None
        if why is not None:
            notes.append(f"peer {name} not measured: {why}")
    for name in NEW_PEERS:
        if name in cfg.peers:
            why = peers.installed(name, _python(cfg, name))
            have[name] = why is None
            if why is not None:
                lines.append(why)
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="side-by-side-"))
    started = time.perf_counter()
    try:
        say("generating and packing")
        paths = _prepare(cfg, work, have, notes)
        _new_peers(cfg, work, paths, have, lines, say)
        monitor = CpuMonitor(machine_info()["usable_cpus"])
        reads = _run_reads(cfg, paths, have, monitor, say, lines)
        packs = _run_packs(cfg, paths, work, have, monitor, say) if cfg.pack else []
        say("decode ceiling")
        ceiling = _decode_ceiling(paths)
        machine = machine_info()
        machine["foreign_cpu"] = monitor.summary()
    finally:
        if cfg.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return {"config": {**asdict(cfg), "peers": list(cfg.peers)}, "machine": machine, "reads": reads, "packs": packs,
            "ceiling": ceiling, "notes": notes, "peer_lines": lines, "have": have,
            "seconds": time.perf_counter() - started}


def _median_row(base: dict[str, Any], runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    def med(k: str) -> float | None:
        vals = [r[k] for r in runs if r.get(k) is not None]
        return statistics.median(vals) if vals else None

    row = dict(base)
    row.update({key: med(key), "runs": [r[key] for r in runs], "load": med("load"), "foreign": med("foreign"),
                "private_mb": med("private_mb"), "mapped_mb": med("mapped_mb")})
    if any("cpu_us_per_image" in r for r in runs):
        row["cpu_us_per_image"] = med("cpu_us_per_image")
    chosen = sorted({r["chosen"] for r in runs if r.get("chosen")})  # ours: the workers the loader ran
    if chosen:
        row["chosen"] = "/".join(chosen)
    return row


def _measured(cfg: SideConfig, monitor: CpuMonitor, fn: Callable[..., dict], kwargs: dict,
              python: str | None = None) -> dict[str, Any]:
    load = load_average()
    monitor.sample(keep=False)
    out = _call(cfg, fn, kwargs, python=python)
    out.update(load=load, foreign=monitor.sample())
    return out


def _run_reads(cfg: SideConfig, paths: dict[str, Any], have: dict[str, bool], monitor: CpuMonitor,
               say: Callable[[str], None], lines: list[str] | None = None) -> list[dict[str, Any]]:
    """Every read case, repeat by repeat. A 2026 peer's case that fails is one line in ``lines`` and
    is measured no more (its row left out); a failure of any other case ends the run."""
    cases = read_cases(cfg, have)
    _warm(paths)
    runs: dict[ReadCase, list[dict]] = {c: [] for c in cases}
    failed: set[ReadCase] = set()
    for rep in range(cfg.repeats):
        for case in cases:
            if case in failed:
                continue
            say(f"[{rep + 1}/{cfg.repeats}] read {case.label()}")
            new = case.who == "peer" and case.name in NEW_PEERS
            try:
                runs[case].append(_measured(cfg, monitor, measure_read, {
                    "case": tuple(case), "paths": _peer_paths(paths) if new else paths, "batch_size": cfg.batch_size,
                    "warmup": cfg.warmup, "min_seconds": cfg.min_seconds},
                    python=_python(cfg, case.name) if new else None))
            except Exception as exc:  # noqa: BLE001 - only a 2026 peer's failure is kept as a line
                if not new:
                    raise
                failed.add(case)
                (lines if lines is not None else []).append(f"peer {case.name} {case.mode} failed while measured "
                                                            f"(repeat {rep + 1}), left out: {_first_line(exc)}")
    return [_median_row(case._asdict(), runs[case], "samples_per_s") for case in cases if case not in failed]


def _run_packs(cfg: SideConfig, paths: dict[str, Any], work: Path, have: dict[str, bool], monitor: CpuMonitor,
               say: Callable[[str], None]) -> list[dict[str, Any]]:
    from readers.contract.env import available_cpus

    cases = [(name, v) for name in PACKERS if name != "peer:mds" or have.get("streaming")
             for v in ((True, False) if name.startswith("ours") else (False,))]
    runs: dict[tuple, list[dict]] = {c: [] for c in cases}
    for rep in range(cfg.pack_repeats):
        for name, validate in cases:
            say(f"[{rep + 1}/{cfg.pack_repeats}] pack {name} validate={'on' if validate else 'off'}")
            out = work / "pack-out"
            shutil.rmtree(out, ignore_errors=True)
            os.sync()  # every pack starts with no dirty pages left by the one before (writeback throttling)
            runs[(name, validate)].append(_measured(cfg, monitor, measure_pack, {
                "name": name, "src": paths["src"], "out": str(out), "validate": validate,
                "workers": available_cpus()}))
            shutil.rmtree(out, ignore_errors=True)
    return [_median_row({"name": n, "validate": v}, runs[(n, v)], "images_per_s") for n, v in cases]
