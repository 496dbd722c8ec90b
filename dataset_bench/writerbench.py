"""Writing from Python, side by side: ``packer.Writer`` and ``packer.pack_map`` against the peers' writers.

Issue 34's goal for the Writer: without validation it writes at least as many samples/s as the
fastest peer writer measured in the same run (1.0x). One run:

1. makes ``n`` in-memory samples ``{"image": JPEG bytes, "label": int, "caption": str}``: the
   images are the project's ImageNet-like JPEGs (:mod:`dataset_bench.synth`, cut from the bundled
   photos) at a few sizes (:data:`SIZES`, ~10-95 KB), the same samples for every job;
2. measures each job of :func:`jobs` on them: the Writer into each format with validation on (the
   default) and off (``PackOptions(validate=False)``), ``pack_map`` (an identity ``fn``) with 0
   and 2 workers, and the peers' writers (:data:`PEERS`: ``webdataset.ShardWriter``,
   mosaicml-streaming's ``MDSWriter``, LitData's ``optimize``, FFCV's ``DatasetWriter``), each
   optional: a peer that does not import is one row ``skipped: <package> not installed``;
3. times each measurement after an untimed warm-up run of the same job in the same process (its
   output removed), optionally in a fresh interpreter per measurement
   (:func:`dataset_bench.isolate.run_isolated`), repeats interleaved job by job so that load from
   elsewhere hits every job alike, and reports the median;
4. checks every output: it is read back with the writer's own reader, in the measuring process
   (:func:`read_back`), and must hold the ``n`` samples: their labels and captions in order (ours,
   webdataset, MDS), as a multiset (LitData, whose workers decide the order) or their labels in
   order (FFCV, whose bytes fields need its loader) (:func:`check`).

A peer may live in a venv of its own (``run(pythons=...)``, the bench's ``--peer-venvs``): its
measurements then run in that interpreter. Ours fsync what they write; the peers' writers do not, so
a peer's measurement also times an fsync of its output after the write (the ``peer+fsync`` column).

mmap stores decoded pixels, so its rows decode every image whatever ``validate`` says; it is
shown, but the goal is judged on the formats that store the JPEG bytes (:data:`BYTES_FORMATS`).

The peers' writers of :mod:`dataset_bench.peerwriters` read image files and write image + label;
these write the in-memory samples, caption included, so that every job writes the same thing.

Here: :func:`make_samples`, :func:`jobs`, :func:`measure` (one timed job), :func:`run` (the whole
run: rows, ratios, the goal) and :func:`format_table`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import pickle
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dataset_bench.machine import CpuMonitor, load_average, load_summary

__all__ = ["SIZES", "BYTES_FORMATS", "PEERS", "Job", "make_samples", "jobs", "probe", "measure", "read_back",
           "check", "run", "format_table", "GOAL"]

#: image sizes (width, height) the samples are cut at, in turn: ~10 KB, ~35 KB, ~95 KB JPEGs at quality 90
SIZES = ((160, 120), (320, 256), (480, 400))
#: our formats that store the JPEG bytes as given: the goal is judged on these
BYTES_FORMATS = ("wds", "lmdb", "hdf5")
FORMATS = BYTES_FORMATS + ("mmap",)
#: peer -> (its package, how its row names it); ``--peer-python PACKAGE=PYTHON`` names the package
PEERS = {"shardwriter": ("webdataset", "webdataset ShardWriter"),
         "mds": ("streaming", "streaming MDSWriter"),
         "litdata": ("litdata", "litdata optimize (2 workers)"),
         "ffcv": ("ffcv", "ffcv DatasetWriter (2 workers)")}
#: peer -> the module its writer is, which must import (in this interpreter or in the peer's own)
PEER_MODULES = {"shardwriter": "webdataset", "mds": "streaming", "litdata": "litdata", "ffcv": "ffcv.writer"}
#: peer -> its distribution on PyPI (the version a run reports)
DISTRIBUTIONS = {"shardwriter": "webdataset", "mds": "mosaicml-streaming", "litdata": "litdata", "ffcv": "ffcv"}
GOAL = 1.0  #: Writer with validate=False / fastest peer writer
PEER_WORKERS = 2  # the peers whose writers run worker processes get as many as this machine has cores
CLASSES = 10
_WORDS = ("a", "photo", "of", "the", "small", "large", "red", "dog", "cat", "street", "in", "morning", "light",
          "close-up", "with", "two", "people", "near", "water", "old")


@dataclass(frozen=True)
class Job:
    """One writing job: ``kind`` "writer" / "pack_map" (ours, into ``format``) or "peer" (``peer``)."""

    kind: str
    format: str = ""
    validate: bool = True
    workers: int = 0
    peer: str = ""

    @property
    def name(self) -> str:
        if self.kind == "peer":
            return PEERS[self.peer][1]
        check = "" if self.validate else " validate=False"
        if self.kind == "writer":
            return f"Writer {self.format}{check}"
        return f"pack_map {self.format} workers={self.workers}{check}"


def jobs() -> list[Job]:
    """Every job of a run, ours first: the Writer per format with validation on and off, ``pack_map``
    into wds with 0 and 2 workers (validation on and off), then each peer."""
    ours = [Job("writer", fmt, validate) for fmt in FORMATS for validate in (True, False)]
    ours += [Job("pack_map", "wds", validate, workers) for workers in (0, 2) for validate in (True, False)]
    return ours + [Job("peer", peer=peer) for peer in PEERS]


def probe(job: Job, python: str | None = None) -> tuple[str | None, str | None]:
    """``(skipped, version)`` of ``job``'s peer: ``skipped`` None when its writer's module imports (in
    ``python`` when given: a peer's own venv), else its row's text (``skipped: <package> not
    installed`` or why it does not import); ``version`` its distribution's. ``(None, None)`` for ours."""
    if job.kind != "peer":
        return None, None
    package, module = PEERS[job.peer][0], PEER_MODULES[job.peer]
    code = (f"import importlib.metadata as m; import {module}; "
            f"print(m.version({DISTRIBUTIONS[job.peer]!r}))")
    if python:
        import subprocess

        if not os.access(python, os.X_OK):
            return f"skipped: {package}: {python} is not an executable Python", None
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
        lines = r.stderr.strip().splitlines()
        why = None if r.returncode == 0 else (lines[-1] if lines else f"exit code {r.returncode}")
        version = r.stdout.strip() or None
    else:
        try:
            importlib.import_module(module)
            why, version = None, importlib.metadata.version(DISTRIBUTIONS[job.peer])
        except Exception as exc:  # noqa: BLE001 - any failure means "not usable here", said in the row
            why, version = f"{type(exc).__name__}: {exc}", None
    if why is None:
        return None, version
    from readers.contract.messages import one_line

    if f"No module named '{package}'" in why:
        return f"skipped: {package} not installed", None
    return f"skipped: {package}: {one_line(why, 160)}", None  # installed, but it does not import


# --------------------------------------------------------------------------- the samples


def make_samples(n: int, seed: int = 0, work: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """``n`` samples ``{"image": JPEG bytes, "label": i % 10, "caption": 4-12 words}``, the images at
    :data:`SIZES` in turn (generated by :func:`dataset_bench.synth.make_imagenet_like` in a temporary
    folder under ``work``, read into memory, the folder removed). The same arguments give the same samples."""
    import numpy as np

    from dataset_bench.synth import SynthOptions, make_imagenet_like

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    images: list[bytes] = [b""] * n
    with tempfile.TemporaryDirectory(prefix="writerbench-src-", dir=work) as tmp:
        for k, size in enumerate(SIZES):
            picks = list(range(k, n, len(SIZES)))
            if not picks:
                continue
            root = make_imagenet_like(Path(tmp) / str(k), len(picks), 1,
                                      SynthOptions(size=size, jitter=size[0] // 10, seed=seed * 1000 + k))
            for i, path in zip(picks, sorted(root.rglob("*.JPEG"))):
                images[i] = path.read_bytes()
    rng = np.random.default_rng(seed)
    return [{"image": image, "label": i % CLASSES,
             "caption": " ".join(_WORDS[w] for w in rng.integers(0, len(_WORDS), int(rng.integers(4, 13))))}
            for i, image in enumerate(images)]


# --------------------------------------------------------------------------- the writers


def _as_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """pack_map's ``fn``: the input is the sample (what crosses to its workers and back is the job's cost)."""
    return sample


def _write_ours(job: Job, samples: Sequence[dict[str, Any]], out: Path) -> None:
    from packer import PackOptions, Writer, pack_map

    options = PackOptions(validate=job.validate)
    if job.kind == "writer":
        with Writer(out, format=job.format, options=options, overwrite=True) as w:
            for sample in samples:
                w.write(sample)
    else:
        pack_map(_as_sample, samples, out, job.format, workers=job.workers, options=options, overwrite=True,
                 on_error="raise")


def _write_shardwriter(samples: Sequence[dict[str, Any]], out: Path) -> None:
    """``webdataset.ShardWriter``, 256 MB shards (as :func:`dataset_bench.peerwriters.write_shardwriter`),
    members ``jpg``, ``cls`` and ``txt``."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=256e6, verbose=0) as sink:
        for i, s in enumerate(samples):
            sink.write({"__key__": f"{i:010d}", "jpg": s["image"], "cls": s["label"], "txt": s["caption"]})


def _write_mds(samples: Sequence[dict[str, Any]], out: Path) -> None:
    """mosaicml-streaming's ``MDSWriter``, no compression, 256 MB shards (as
    :func:`dataset_bench.peerwriters.write_mds`), columns ``jpg`` bytes, ``cls`` int, ``txt`` str."""
    import streaming

    with streaming.MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int", "txt": "str"},
                             size_limit="256mb", progress_bar=False) as w:
        for s in samples:
            w.write({"jpg": s["image"], "cls": s["label"], "txt": s["caption"]})


def _litdata_item(sample: dict[str, Any]) -> dict[str, Any]:
    return {"jpg": sample["image"], "cls": sample["label"], "txt": sample["caption"]}


def _write_litdata(samples: Sequence[dict[str, Any]], out: Path) -> None:
    """LitData's ``optimize``: ``fn`` maps each input (a sample) to its item, 256 MB chunks, as its
    README optimizes a dataset."""
    import litdata

    litdata.optimize(fn=_litdata_item, inputs=list(samples), output_dir=str(out), chunk_bytes="256MB",
                     num_workers=PEER_WORKERS)


class _FfcvSamples:
    """The samples as FFCV's ``from_indexed_dataset`` takes them: ``(jpg, label, caption)``, the byte
    fields as uint8 arrays."""

    def __init__(self, samples: Sequence[dict[str, Any]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int, Any]:
        import numpy as np

        s = self.samples[i]
        return (np.frombuffer(s["image"], dtype=np.uint8), int(s["label"]),
                np.frombuffer(s["caption"].encode(), dtype=np.uint8))


def _write_ffcv(samples: Sequence[dict[str, Any]], out: Path) -> None:
    """FFCV's ``DatasetWriter``: ``BytesField`` for the JPEG and the caption, ``IntField`` for the label
    (the bytes mode of :func:`dataset_bench.peerwriters.write_ffcv`)."""
    from ffcv.fields import BytesField, IntField
    from ffcv.writer import DatasetWriter

    out.mkdir(parents=True, exist_ok=True)
    DatasetWriter(str(out / "data.beton"), {"jpg": BytesField(), "cls": IntField(), "txt": BytesField()},
                  num_workers=PEER_WORKERS).from_indexed_dataset(_FfcvSamples(samples))


_PEER_WRITERS: dict[str, Callable[[Sequence[dict[str, Any]], Path], None]] = {
    "shardwriter": _write_shardwriter, "mds": _write_mds, "litdata": _write_litdata, "ffcv": _write_ffcv}


def _import(job: Job) -> None:
    """The modules ``job`` runs, imported before the clock starts."""
    if job.kind != "peer":
        importlib.import_module("packer.mapping")
        importlib.import_module(f"packer.formats.{job.format}")
    else:
        importlib.import_module(PEER_MODULES[job.peer])


# --------------------------------------------------------------------------- reading back

#: what :func:`read_back` compares for each writer (the row's ``checked``); "ours" is every format of ours
CHECKED = {"ours": "labels and captions in order", "shardwriter": "labels and captions in order",
           "mds": "labels and captions in order", "litdata": "labels and captions (as a multiset)",
           "ffcv": "labels in order"}


def read_back(job: Job, out: Path) -> tuple[int, list[tuple[int, str | None]], bool]:
    """What ``out`` holds, read with the writer's own reader: ``(count, [(label, caption or None)],
    ordered)``; the caption is None where the peer's reader does not give it back cheaply (FFCV's
    bytes fields need its loader), ``ordered`` False where the writer's workers decide the order
    (LitData's ``optimize``)."""
    if job.kind != "peer":
        from readers import open_dataset

        kw: dict[str, Any] = {"shuffle": False, "pad": False} if job.format == "wds" else {}
        ds = open_dataset(out, fields=("label", "caption"), decode=False, **kw)
        try:
            rows = list(ds) if job.format == "wds" else [ds[i] for i in range(len(ds))]
        finally:
            ds.close()
        return len(rows), [(int(label), str(caption)) for label, caption in rows], True
    got: list[tuple[int, str | None]]
    if job.peer == "shardwriter":
        import webdataset as wds

        shards = sorted(str(p) for p in out.glob("*.tar"))
        got = [(int(s["cls"]), s["txt"].decode()) for s in wds.WebDataset(shards, shardshuffle=False)]
    elif job.peer == "mds":
        from streaming import LocalDataset

        mds = LocalDataset(local=str(out))
        got = [(int(s["cls"]), str(s["txt"])) for s in (mds[i] for i in range(len(mds)))]
    elif job.peer == "litdata":
        import litdata

        lit = litdata.StreamingDataset(str(out))
        got = [(int(s["cls"]), str(s["txt"])) for s in (lit[i] for i in range(len(lit)))]
        return len(got), got, False
    else:
        from ffcv.reader import Reader

        reader = Reader(str(out / "data.beton"))
        got = [(int(label), None) for label in reader.metadata["f1"]]  # IntField: the value is its metadata
    return len(got), got, True


def check(got: list[tuple[int, str | None]], ordered: bool, want: list[tuple[int, str]]) -> str | None:
    """None when ``got`` (from :func:`read_back`) holds the samples ``want``, else what differs."""
    if len(got) != len(want):
        return f"read back {len(got)} samples, wrote {len(want)}"
    expect: list[tuple[int, str | None]] = [(label, caption if g[1] is not None else None)
                                            for (label, caption), g in zip(want, got)] if ordered else \
        [(label, caption) for label, caption in want]
    if not ordered:
        return None if sorted(got, key=repr) == sorted(expect, key=repr) else "the labels/captions differ"
    bad = next((i for i, (a, b) in enumerate(zip(got, expect)) if a != b), None)
    return None if bad is None else f"sample {bad}'s label/caption differ"


# --------------------------------------------------------------------------- one measurement


def _fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` and every folder (what our writers do before they publish)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def measure(job: Job, samples: Sequence[dict[str, Any]] | str, out: str, warmup: bool = True) -> dict[str, Any]:
    """Write ``samples`` (or the pickled list at that path, loaded first) with ``job`` into ``out``;
    samples/s of the whole job, opening and closing included, then what :func:`read_back` finds.

    ``warmup``: the same job runs once first, untimed, and its output is removed: the timed run then
    finds the modules, the pools' code paths and the memory it draws warm (on this project's VM a
    cold write pays first-touch faults: see :func:`dataset_bench.sidemeasure.measure_pack`).

    Ours fsync what they write (each shard or data file before the index is published); the peers'
    writers do not. So for a peer the time to fsync its output after the write is measured too
    (``fsync_seconds``; ``samples_per_s_fsynced``: the write and that fsync), which is what the
    same durability would have cost it."""
    if isinstance(samples, str):
        with open(samples, "rb") as f:
            samples = pickle.load(f)
    assert not isinstance(samples, str)
    _import(job)
    path = Path(out)

    def once() -> float:
        t0 = time.perf_counter()
        if job.kind == "peer":
            _PEER_WRITERS[job.peer](samples, path)
        else:
            _write_ours(job, samples, path)
        return time.perf_counter() - t0

    if warmup:
        once()
        shutil.rmtree(path, ignore_errors=True)
    seconds = once()
    result: dict[str, Any] = {"seconds": seconds, "samples_per_s": len(samples) / seconds}
    if job.kind == "peer":
        t0 = time.perf_counter()
        _fsync_tree(path)
        result["fsync_seconds"] = fsync = time.perf_counter() - t0
        result["samples_per_s_fsynced"] = len(samples) / (seconds + fsync)
    result["read_back"], result["got"], result["ordered"] = read_back(job, path)
    return result


# --------------------------------------------------------------------------- the run


def run(n: int, repeats: int, *, isolated: bool, seed: int = 0, work: str | os.PathLike | None = None,
        pythons: Mapping[str, str] | None = None, say: Callable[[str], None] = lambda _line: None) -> dict[str, Any]:
    """The whole run (see the module docstring): ``n`` samples, ``repeats`` timed runs of each job,
    each in a fresh interpreter when ``isolated``. ``pythons``: package (``streaming``, ``litdata``,
    ``ffcv``, ``webdataset``) -> the interpreter of a venv that has that peer; its measurements run
    there, in a fresh process whatever ``isolated`` says. Returns ``{"settings", "rows", "goal",
    "load"}``: a row per job with its median samples/s, every repeat's, its ratio to the fastest peer
    writer, and what was read back (``read_back`` samples, ``check`` "ok", ``checked`` what was
    compared); a peer's row also has its samples/s with an fsync of its output
    (``samples_per_s_fsynced``); a skipped peer's row has ``skipped`` instead. Raises RuntimeError
    when an output does not read back."""
    from readers.contract.env import available_cpus

    pythons = dict(pythons or {})
    samples = make_samples(n, seed, work)
    want = [(s["label"], s["caption"]) for s in samples]
    rows: list[dict[str, Any]] = []
    for job in jobs():
        python = pythons.get(PEERS[job.peer][0]) if job.kind == "peer" else None
        skip, version = probe(job, python)
        rows.append({"job": job.name, "kind": job.kind, "format": job.format, "validate": job.validate,
                     "workers": job.workers, "peer": job.peer, "python": python, "version": version,
                     "skipped": skip, "checked": CHECKED[job.peer or "ours"], "runs": []})
    todo = [(job, row) for job, row in zip(jobs(), rows) if row["skipped"] is None]
    monitor, loads = CpuMonitor(available_cpus()), []
    with tempfile.TemporaryDirectory(prefix="writerbench-", dir=work) as tmp:
        data = os.path.join(tmp, "samples.pkl")
        if isolated or any(row["python"] for _, row in todo):
            with open(data, "wb") as f:
                pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)
        for r in range(repeats):
            for job, row in todo:
                out = os.path.join(tmp, "out")
                loads.append(load_average())
                monitor.sample(keep=False)
                if isolated or row["python"]:
                    from dataset_bench.isolate import run_isolated

                    got = run_isolated(measure, {"job": job, "samples": data, "out": out}, python=row["python"])
                else:
                    got = measure(job, samples, out)
                monitor.sample()
                shutil.rmtree(out, ignore_errors=True)
                wrong = check(got["got"], got["ordered"], want)
                if wrong:
                    raise RuntimeError(f"{job.name}: {wrong}")
                row["runs"].append(round(got["samples_per_s"], 1))
                if "samples_per_s_fsynced" in got:
                    row.setdefault("runs_fsynced", []).append(round(got["samples_per_s_fsynced"], 1))
                row["read_back"], row["check"] = got["read_back"], "ok"
                say(f"repeat {r + 1}/{repeats} {job.name}: {got['samples_per_s']:,.0f} samples/s")
    for row in rows:
        row["samples_per_s"] = statistics.median(row["runs"]) if row["runs"] else None
        if row.get("runs_fsynced"):
            row["samples_per_s_fsynced"] = statistics.median(row["runs_fsynced"])
    peers = [row for row in rows if row["kind"] == "peer" and row["samples_per_s"]]
    fastest = max(peers, key=lambda row: row["samples_per_s"], default=None)
    for row in rows:
        row["ratio"] = (round(row["samples_per_s"] / fastest["samples_per_s"], 3)
                        if fastest is not None and row["samples_per_s"] else None)
    return {"settings": {"samples": n, "repeats": repeats, "isolated": isolated, "seed": seed,
                         "sizes": [list(s) for s in SIZES],
                         "mean_image_kb": round(sum(len(s["image"]) for s in samples) / n / 1024, 1),
                         "peer_workers": PEER_WORKERS, "peer_pythons": pythons},
            "rows": rows, "goal": goal(rows, fastest), "load": {"load_average": load_summary(loads),
                                                                 "foreign_cpu": monitor.summary()}}


def goal(rows: list[dict[str, Any]], fastest: dict[str, Any] | None) -> dict[str, Any]:
    """The 1.0x goal: the Writer with ``validate=False`` into each of :data:`BYTES_FORMATS` against the
    fastest peer writer; ``holds`` is None when no peer was measured."""
    if fastest is None:
        return {"fastest_peer": None, "ratios": {}, "holds": None}
    ratios = {row["format"]: row["ratio"] for row in rows
              if row["kind"] == "writer" and not row["validate"] and row["format"] in BYTES_FORMATS}
    return {"fastest_peer": fastest["job"], "fastest_peer_samples_per_s": fastest["samples_per_s"],
            "ratios": ratios, "met": sorted(f for f, r in ratios.items() if r >= GOAL),
            "holds": all(r >= GOAL for r in ratios.values())}


def format_table(result: dict[str, Any]) -> list[str]:
    """The run as printed lines: a header, a row per job (``job  samples/s  ratio  peer+fsync  read back``),
    a note on durability, the goal."""
    lines = [f"{'job':40s} {'samples/s':>10s} {'vs fastest peer':>15s} {'peer+fsync':>10s}  read back"]
    for row in result["rows"]:
        if row["skipped"]:
            lines.append(f"{row['job']:40s} {row['skipped']}")
            continue
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
        synced = f"{row['samples_per_s_fsynced']:,.0f}" if row.get("samples_per_s_fsynced") else "-"
        lines.append(f"{row['job']:40s} {row['samples_per_s']:10,.0f} {ratio:>15s} {synced:>10s}  "
                     f"{row['read_back']} {row['check']}")
    lines.append("(ours fsync what they write before the index is published; the peers' writers do not: "
                 "peer+fsync is a peer's write and an fsync of its output after it)")
    g = result["goal"]
    if g["holds"] is None:
        lines.append(f"goal {GOAL:g}x (Writer validate=False >= fastest peer writer): not judged, no peer measured")
    else:
        each = ", ".join(f"{fmt} {r:.2f}x" for fmt, r in g["ratios"].items())
        lines.append(f"goal {GOAL:g}x (Writer validate=False >= fastest peer writer, {g['fastest_peer']}): "
                     f"{'holds' if g['holds'] else 'does not hold'} ({each})")
    return lines


def to_json(result: dict[str, Any]) -> str:
    """The run as JSON text (what ``--json`` writes)."""
    return json.dumps(result, indent=2)
