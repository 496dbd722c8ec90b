"""Side by side with the peers, in one run: reading, packing and memory, with each target's ratio.

One run generates ImageNet-like JPEGs (``dataset_bench.synth``), packs them into our
formats (``mmap`` at ``mmap_size`` so the naive ``np.memmap`` peer reads the
very same pixel file), writes what the peers need (FFCV files when ``ffcv``
imports), then measures, interleaved repeat by repeat so that load from
elsewhere hits every case alike:

* reading: every peer (:mod:`dataset_bench.peerreaders`, :mod:`dataset_bench.newpeers`) and every
  format of ours in every mode (:data:`dataset_bench.sidecases.MODES`) with 0 workers and with
  ``workers`` worker processes and threads, and
  with ``workers`` and ``make_loader``'s own choice of worker kind (kind ``defaults``: no
  ``workers=`` argument; the row's ``chosen`` says what the loader ran,
  :func:`dataset_bench.sidemeasure.chosen_workers`). Each case runs in a fresh interpreter: a
  loader is built, ``warmup`` batches are drawn, then batches are timed over
  as many passes as fill ``min_seconds``; peak private memory (anonymous PSS of
  all the loader's processes, plus the machine's shared memory grown since the
  loader was built, which holds its batches in flight) is sampled while it runs and
  the data files' mapped pages at the end (:mod:`dataset_bench.memory`);
* packing: ``pack()`` per format with validation on and off, against the
  plain writers of :mod:`dataset_bench.peerwriters`; images/s of the whole call;
* the per-core decode ceiling: the eval transform on one core.

The 2026 peers (:data:`dataset_bench.peers.NEW_PEERS`: DALI CPU, SPDL, Grain over
ArrayRecord, Lance, Megatron-Energon) are each optional: a missing one is one line
``peer X skipped: not installed (pip install ...)``. One may live in its own venv
(``peer_pythons``: its preparation, check and measurements then run in that venv's
interpreter through :func:`dataset_bench.isolate.run_isolated`). Before one is timed, one
epoch of each of its modes is checked against the folder
(:func:`dataset_bench.sidemeasure.same_samples`); a mismatch or an error is one failure line and
that mode is not timed.

Before each measurement the 1-minute load average is read and, around it, the
share of CPU time other processes took (:class:`dataset_bench.machine.CpuMonitor`);
both are kept with the figure. :func:`dataset_bench.sidereport.targets` turns the medians into
the issue's ratios with met / not met; :mod:`dataset_bench.sidereport` prints and draws.

Here: the run (:func:`run_side_by_side`). Its configuration and read cases are in
:mod:`dataset_bench.sidecases`, each measurement in :mod:`dataset_bench.sidemeasure`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

from dataset_bench.machine import CpuMonitor, load_average, machine_info
from dataset_bench.peers import NEW_PEERS
from dataset_bench.sidecases import CROP, FORMATS, PACKERS, ReadCase, SideConfig, read_cases
from dataset_bench.sidemeasure import folder_samples, measure_pack, measure_read, peer_samples, prepare_peer, \
    same_samples
from readers.contract.messages import one_line

__all__ = ["run_side_by_side"]


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
        from dataset_bench.naive import NaiveImageFolder
        from dataset_bench.peerwriters import write_ffcv

        folder = NaiveImageFolder(src)
        paths["ffcv"] = {k: str(v) for k, v in write_ffcv(folder.files, folder.labels, work / "ffcv").items()}
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
