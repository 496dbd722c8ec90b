"""How fast ``pack-dataset convert`` turns one packed format into another, beside a raw copy.

The baseline is what any conversion must at least do: read the source
dataset's data files and write their bytes into one new file, fsync at the
end (:func:`raw_copy`). Each conversion (:func:`time_convert`) goes through
``packer.tools.convert.convert`` (the Python API: no CLI start-up) and copies every
sample with its checksum checked. Rounds interleave the baseline and every
conversion (in an order rotated each round), so a burst of load from elsewhere
on the machine spreads over all of them; medians are reported (:func:`measure_conversions`). Each timed run
starts after an untimed ``os.sync()``, so write-back left by the previous one
(and the deletion of its output) is not charged to it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from readers.contract import spec

__all__ = ["ENCODED_PAIRS", "data_files", "raw_copy", "time_convert", "measure_conversions", "format_table"]

#: the encoded -> encoded conversions measured by default (target: >= 0.8x the raw copy rate)
ENCODED_PAIRS = (("wds", "lmdb"), ("wds", "hdf5"), ("lmdb", "wds"), ("hdf5", "wds"), ("lmdb", "hdf5"))


def data_files(root: Path) -> list[Path]:
    """The data files of the packed dataset ``root`` (shards, ``data.mdb``, ``data.h5``, ``images.npy``)."""
    meta = spec.read_index(root).meta
    return [root / name for name in meta["files"]]


def raw_copy(files: Sequence[Path], dest: Path) -> float:
    """Read every file, write them concatenated to ``dest``, fsync: seconds (``dest`` is removed)."""
    os.sync()  # untimed: no write-back left over from earlier work lands in this measurement
    t0 = time.perf_counter()
    with open(dest, "wb") as out:
        for p in files:
            with open(p, "rb") as f:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - t0
    dest.unlink()
    return seconds


def time_convert(src: Path, out: Path, fmt: str, **options: Any) -> float:
    """Seconds for ``convert(src, out)`` into ``fmt`` (``out`` is replaced first, untimed)."""
    from packer import PackOptions
    from packer.tools.convert import convert

    if out.exists():
        shutil.rmtree(out)
    os.sync()  # untimed, as for the raw copy
    t0 = time.perf_counter()
    convert(src, out, PackOptions(format=fmt, **options))
    return time.perf_counter() - t0


def measure_conversions(sources: dict[str, Path], pairs: Sequence[tuple[str, str]], work: Path, repeats: int, *,
                        options: dict[str, Any] | None = None,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Raw copy of each source format and each (source, target) conversion, ``repeats`` rounds.

    Returns ``{"raw": {fmt: {...}}, "rows": [{source, target, ...}, ...]}`` with medians, MB/s
    (raw: data-file bytes; conversions: stored sample bytes) and ``vs_raw`` = conversion MB/s over the
    raw copy MB/s of the same source.
    """
    options = options or {}
    raw_runs: dict[str, list[float]] = {fmt: [] for fmt in sorted({s for s, _ in pairs})}
    runs: dict[tuple[str, str], list[float]] = {p: [] for p in pairs}
    # ("raw", fmt) or (source, target): a raw copy of fmt's files, or a conversion
    ops: list[tuple[str, str]] = [("raw", fmt) for fmt in raw_runs] + list(pairs)
    for rnd in range(repeats):
        # Rotated each round: the first write after a while is slower here (page allocation), and
        # rotating keeps that from landing on the same measurement every round.
        for op in ops[rnd % len(ops):] + ops[:rnd % len(ops)]:
            if op not in runs:
                fmt = op[1]
                raw_runs[fmt].append(raw_copy(data_files(sources[fmt]), work / "raw.bin"))
            else:
                s, t = op
                out = work / f"{s}-to-{t}"
                runs[op].append(time_convert(sources[s], out, t, **options.get(t, {})))
                shutil.rmtree(out)
        if progress:
            progress(f"round {rnd + 1}/{repeats}: raw " + ", ".join(f"{f} {v[-1]:.3f} s" for f, v in raw_runs.items())
                     + "; " + ", ".join(f"{s}->{t} {runs[(s, t)][-1]:.3f} s" for s, t in pairs))
    return _summarize(sources, raw_runs, runs)


def _summarize(sources: dict[str, Path], raw_runs: dict[str, list[float]],
               runs: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    raw: dict[str, dict[str, Any]] = {}
    for fmt, times in raw_runs.items():
        nbytes = sum(p.stat().st_size for p in data_files(sources[fmt]))
        med = statistics.median(times)
        raw[fmt] = {"runs_s": times, "median_s": med, "mb": nbytes / 1e6, "mb_per_s": nbytes / 1e6 / med}
    rows = []
    for (s, t), times in runs.items():
        index = spec.read_index(sources[s])
        payload, n = int(index.arrays["sizes"].sum()), index.num_samples
        med = statistics.median(times)
        rate = payload / 1e6 / med
        rows.append({"source": s, "target": t, "runs_s": times, "median_s": med, "samples": n,
                     "samples_per_s": n / med, "mb": payload / 1e6, "mb_per_s": rate,
                     "raw_mb_per_s": raw[s]["mb_per_s"], "vs_raw": rate / raw[s]["mb_per_s"]})
    return {"raw": raw, "rows": rows}


def format_table(result: dict[str, Any]) -> str:
    """The conversions beside the raw copy rate of their source, one line each."""
    header = f"{'conversion':<14} {'median s':>9} {'samples/s':>10} {'MB/s':>8} {'raw copy MB/s':>14} {'vs raw':>7}"
    lines = [header, "-" * len(header)]
    for fmt, r in result["raw"].items():
        lines.append(f"{'raw ' + fmt:<14} {r['median_s']:9.3f} {'-':>10} {r['mb_per_s']:8.1f} "
                     f"{r['mb_per_s']:14.1f} {1.0:7.2f}")
    for r in result["rows"]:
        lines.append(f"{r['source'] + ' -> ' + r['target']:<14} {r['median_s']:9.3f} {r['samples_per_s']:10.0f} "
                     f"{r['mb_per_s']:8.1f} {r['raw_mb_per_s']:14.1f} {r['vs_raw']:7.2f}")
    return "\n".join(lines)
