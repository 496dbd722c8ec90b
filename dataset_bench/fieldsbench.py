"""The fields benchmark (issue 24): image+label reading of the previous release beside this checkout, same run.

``dataset-bench --fields`` generates ImageNet-like JPEGs (:mod:`dataset_bench.synth`), packs them
once with this checkout's packer into every format (``mmap`` as pixels at ``mmap_resize``), and
packs a JSONL manifest of the same images with a made-up caption per row the same way. The
previous release's ``readers`` package is exported from git (``git archive REV readers``) into
the work folder, or taken from ``baseline_src``.

Each case (format x mode x workers) is read in a fresh interpreter whose ``PYTHONPATH`` is
either the exported release or this checkout; both sides run the same timing code (this file,
run as a script with ``python -P``, importing only the stdlib and ``readers``), interleaved
repeat by repeat (old first on even repeats, new first on odd ones), so load from other jobs
hits both alike. The image+label cases call ``open_dataset(path, decode=False)`` (mode
``raw``) or ``open_dataset(path, transform=imagenet_eval_transform())`` (mode ``decoded``),
then ``make_loader(ds, num_workers=W, workers="processes")``, or without ``workers=`` (kind
``defaults``: whatever each side picks). The image+caption cases read the caption pack with
``fields=("image", "caption")`` on this checkout only (the previous release has no fields).

A figure is samples/s from the batch ``max(1, workers)`` to the last (worker start-up left
out), over at most ``max_samples`` samples. Per case the median of the repeats is reported with
their min and max; a case is "within noise" when the new median lies inside the old repeats'
min-max or the old median inside the new ones'.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["FieldsConfig", "FieldsCase", "FieldsResult", "BASELINE_REV", "KINDS", "run_fields_bench",
           "export_readers", "fields_cases", "fields_report"]

BASELINE_REV = "4ba033b"  # main before the fields work: the previous release
FORMATS = ("wds", "lmdb", "hdf5", "mmap")
MODES = ("raw", "decoded")
KINDS = ("processes", "defaults")  # workers="processes", or make_loader's own default (no workers=)
ROWS = ("image+label", "image+caption")
CAPTION_WORDS = ("a", "photo", "of", "the", "small", "red", "dog", "on", "grass", "near", "an", "old", "house",
                 "with", "blue", "sky", "and", "two", "people", "walking", "by", "river")


@dataclass(frozen=True)
class FieldsConfig:
    generate: int = 2000
    formats: tuple[str, ...] = FORMATS
    modes: tuple[str, ...] = MODES
    workers: tuple[int, ...] = (0, 2)
    defaults_workers: tuple[int, ...] = (2,)  # worker counts also read with make_loader's default kind
    repeats: int = 3
    batch_size: int = 64
    max_samples: int | None = None
    baseline_rev: str = BASELINE_REV
    baseline_src: str | None = None  # a folder holding the previous release's readers/ (instead of git)
    work_dir: str | None = None
    mmap_resize: int = 256
    seed: int = 0

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> "FieldsConfig":
        """A CI-sized run: 48 images, wds only, 0 workers, one repeat."""
        base: dict[str, Any] = {"generate": 48, "formats": ("wds",), "workers": (0,), "defaults_workers": (),
                                "repeats": 1, "batch_size": 16}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass(frozen=True)
class FieldsCase:
    row: str  # image+label or image+caption
    format: str
    mode: str
    workers: int
    kind: str

    @property
    def name(self) -> str:
        return f"{self.row} {self.format} {self.mode} w{self.workers} {self.kind}"


@dataclass
class FieldsResult:
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    loads: list[float]  # the 1-minute load average before each measurement
    seconds: float
    baseline: str  # what the old side ran (the rev or the folder)
    notes: list[str] = field(default_factory=list)

    def save_json(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return p


def fields_cases(cfg: FieldsConfig) -> list[FieldsCase]:
    """Every case of a run, image+label first then image+caption, per format, mode, workers and kind."""
    out = []
    for row in ROWS:
        for fmt in cfg.formats:
            for mode in cfg.modes:
                for w in cfg.workers:
                    out.append(FieldsCase(row, fmt, mode, w, "processes"))
                for w in cfg.defaults_workers:
                    out.append(FieldsCase(row, fmt, mode, w, "defaults"))
    return out


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def export_readers(rev: str, dest: str | os.PathLike, repo: str | os.PathLike | None = None) -> Path:
    """``git archive REV readers`` of ``repo`` (default: this checkout) extracted under ``dest``; returns ``dest``.

    A rev git does not know, or no git checkout, is a ValueError of one line.
    """
    repo = Path(repo) if repo is not None else _repo_root()
    dest = Path(dest)
    proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "readers"],
                          capture_output=True, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(f"baseline rev {rev!r}: git archive in {repo} failed: {err[-1] if err else proc.returncode}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tmp:
        tmp.write(proc.stdout)
        tmp.seek(0)
        with tarfile.open(fileobj=tmp) as tar:
            tar.extractall(dest, filter="data")
    return dest


def write_caption_manifest(images: Path, manifest: Path, seed: int = 0) -> int:
    """A JSONL manifest of every JPEG under ``images`` (paths relative to the manifest) with a made-up caption."""
    import random

    rng = random.Random(seed)
    paths = sorted(p for p in images.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))
    with open(manifest, "w", encoding="utf-8") as f:
        for p in paths:
            caption = " ".join(rng.choice(CAPTION_WORDS) for _ in range(rng.randint(6, 20)))
            f.write(json.dumps({"image": os.path.relpath(p, manifest.parent), "caption": caption}) + "\n")
    return len(paths)


def _side_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    return env


def _measure(root: Path, job: dict[str, Any]) -> dict[str, Any]:
    """This file's :func:`_child_main` in a fresh interpreter with ``readers`` from ``root``."""
    fd, out = tempfile.mkstemp(prefix="dataset-bench-fields-", suffix=".json")
    os.close(fd)
    try:
        proc = subprocess.run([sys.executable, "-P", str(Path(__file__).resolve()), out],
                              input=json.dumps(job).encode(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=_side_env(root), check=False)
        text = Path(out).read_text()
    finally:
        os.unlink(out)
    if proc.returncode != 0 or not text:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"reading {job['path']} with readers from {root} failed (exit code {proc.returncode}): "
                           f"{tail[-1] if tail else 'no output'}")
    result: dict[str, Any] = json.loads(text)
    if not Path(result["readers"]).resolve().is_relative_to(root.resolve()):
        raise RuntimeError(f"the child imported readers from {result['readers']}, not from {root}")
    return result


def _prepare(cfg: FieldsConfig, work: Path, note: Callable[[str], None]) -> tuple[dict[str, Path], dict[str, Path]]:
    """Generate the images, pack them and the caption manifest into every format; (label, caption) folders."""
    from dataset_bench.synth import generate_image_folder
    from dataset_bench.targets import pack_formats

    images = work / "images"
    if not images.is_dir():
        note(f"generating {cfg.generate} images")
        generate_image_folder(images, cfg.generate, seed=cfg.seed)
    manifest = work / "captions.jsonl"
    write_caption_manifest(images, manifest, seed=cfg.seed)
    note("packing the image folder")
    label = pack_formats(images, work / "label", cfg.formats, mmap_resize=cfg.mmap_resize)
    note("packing the caption manifest")
    caption = pack_formats(manifest, work / "caption", cfg.formats, mmap_resize=cfg.mmap_resize)
    return label, caption


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_fields_bench(cfg: FieldsConfig, progress: Callable[[str, int, int], None] | None = None) -> FieldsResult:
    """Pack once, export the previous release's readers, time every case on both sides; see the module doc.

    ``progress(step, done, total)`` is called before each measurement.
    """
    from dataset_bench.machine import load_average

    t0 = time.perf_counter()
    tmp = None
    if cfg.work_dir:
        work = Path(cfg.work_dir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="dataset-bench-fields-")
        work = Path(tmp.name)
    try:
        notes: list[str] = []
        say = (lambda s: progress(s, 0, 0)) if progress else (lambda s: None)
        if cfg.baseline_src:
            old_root = Path(cfg.baseline_src)
            if not (old_root / "readers" / "__init__.py").is_file():
                raise ValueError(f"--baseline-src {old_root}: no readers/__init__.py there")
            baseline = str(old_root)
        else:
            old_root = export_readers(cfg.baseline_rev, work / f"baseline-{cfg.baseline_rev}")
            baseline = cfg.baseline_rev
        new_root = _repo_root()
        label, caption = _prepare(cfg, work, say)
        cases = fields_cases(cfg)
        runs = {c: {"old": [], "new": []} for c in cases}  # type: dict[FieldsCase, dict[str, list[float]]]
        loads: list[float] = []
        total = cfg.repeats * sum(2 if c.row == "image+label" else 1 for c in cases)
        done = 0
        for r in range(cfg.repeats):
            for case in cases:
                sides = ("old", "new") if case.row == "image+label" else ("new",)
                if r % 2:
                    sides = sides[::-1]
                for side in sides:
                    if progress:
                        progress(f"{case.name} {side}", done, total)
                    load = load_average()
                    if load is not None:
                        loads.append(load)
                    job = {"path": str((label if case.row == "image+label" else caption)[case.format]),
                           "fields": ["image", "caption"] if case.row == "image+caption" else None,
                           "mode": case.mode, "workers": case.workers, "kind": case.kind,
                           "batch_size": cfg.batch_size, "max_samples": cfg.max_samples, "seed": cfg.seed}
                    res = _measure(old_root if side == "old" else new_root, job)
                    runs[case][side].append(res["samples_per_s"])
                    done += 1
        rows = []
        for case in cases:
            row: dict[str, Any] = asdict(case)
            for side in ("old", "new"):
                row[side] = _summary(runs[case][side]) if runs[case][side] else None
            old, new = row["old"], row["new"]
            if old is not None:
                row["ratio"] = new["median"] / old["median"] if old["median"] else None
                row["within_noise"] = (old["min"] <= new["median"] <= old["max"]
                                       or new["min"] <= old["median"] <= new["max"])
            else:  # image+caption: against this checkout's image+label case of the same format, mode, workers
                ref = runs[FieldsCase("image+label", case.format, case.mode, case.workers, case.kind)]["new"]
                row["ratio_to_label"] = new["median"] / statistics.median(ref) if ref else None
            rows.append(row)
        return FieldsResult(config=asdict(cfg), rows=rows, loads=loads, seconds=time.perf_counter() - t0,
                            baseline=baseline, notes=notes)
    finally:
        if tmp is not None:
            tmp.cleanup()


def fields_report(result: FieldsResult) -> str:
    """The table: per case old and new samples/s (median, min-max of the repeats), new/old, within noise."""
    cfg = result.config
    lines = [f"fields benchmark: previous release {result.baseline} vs this checkout, {cfg['generate']} images, "
             f"batch {cfg['batch_size']}, {cfg['repeats']} repeats (median, min-max), samples/s",
             f"load average (1 min) over the run: {min(result.loads, default=0):.1f}-"
             f"{max(result.loads, default=0):.1f}",
             ""]

    def fig(s: dict[str, float] | None) -> str:
        return "-" if s is None else f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"

    head = f"{'row':<14}{'format':<7}{'mode':<8}{'workers':<13}{'old':>20}{'new':>20}  ratio"
    lines += [head, "-" * len(head)]
    for row in result.rows:
        workers = f"{row['workers']} {row['kind'] if row['kind'] == 'defaults' else 'proc'}"
        if row["old"] is not None:
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
            verdict = "within noise" if row["within_noise"] else "outside noise"
            tail = f"  {ratio} new/old, {verdict}"
        else:
            r = row.get("ratio_to_label")
            tail = "  -" if r is None else f"  {r:.2f} of image+label (new)"
        lines.append(f"{row['row']:<14}{row['format']:<7}{row['mode']:<8}{workers:<13}{fig(row['old']):>20}"
                     f"{fig(row['new']):>20}{tail}")
    lines.append(f"\n{len(result.rows)} cases in {result.seconds:.0f} s")
    return "\n".join(lines)


# ---- the child: run as a script (python -P this-file OUT) under the side's PYTHONPATH; stdlib + readers only ----


def _child_read(path: str, fields: Sequence[str] | None, mode: str, workers: int, kind: str, batch_size: int,
                max_samples: int | None, seed: int) -> dict[str, Any]:
    import readers
    from readers import make_loader, open_dataset
    try:
        from readers.decode.transforms import imagenet_eval_transform
    except ImportError:  # the previous release: its modules sat at the root of readers/ (by name: not ours)
        import importlib
        imagenet_eval_transform = importlib.import_module("readers.transforms").imagenet_eval_transform

    kw: dict[str, Any] = {} if fields is None else {"fields": tuple(fields)}
    if mode == "raw":
        ds = open_dataset(path, decode=False, **kw)
    else:
        ds = open_dataset(path, transform=imagenet_eval_transform(size=224, resize=256), **kw)
    loader_kw: dict[str, Any] = {} if kind == "defaults" else {"workers": kind}
    t0 = time.perf_counter()
    loader = make_loader(ds, batch_size=batch_size, num_workers=workers, seed=seed, **loader_kw)
    warmup = max(1, int(getattr(loader, "num_workers", 0) or 0))
    arrivals: list[tuple[float, int]] = []
    samples = 0
    it = iter(loader)
    try:
        for batch in it:
            first = batch[0] if isinstance(batch, (tuple, list)) else batch
            samples += len(first)
            arrivals.append((time.perf_counter(), samples))
            if max_samples is not None and samples >= max_samples:
                break
    finally:
        stop = getattr(it, "_shutdown_workers", None)
        if stop is not None:
            stop()
        del it
        close = getattr(ds, "close", None)
        if close is not None:
            close()
    t_last = arrivals[-1][0] if arrivals else t0
    if len(arrivals) > warmup:
        t_start, n_start = arrivals[warmup - 1]
        rate = (samples - n_start) / (t_last - t_start)
    else:
        rate = samples / (t_last - t0) if t_last > t0 else 0.0
    return {"samples": samples, "samples_per_s": rate, "seconds": t_last - t0,
            "readers": os.path.dirname(os.path.dirname(os.path.abspath(readers.__file__ or "")))}


def _child_main(out: str) -> None:
    job = json.loads(sys.stdin.read())
    result = _child_read(**job)
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    _child_main(sys.argv[1])
