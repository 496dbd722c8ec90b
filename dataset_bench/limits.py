"""The machine's raw limits, measured beside the loaders: sequential read and single-core decode rates.

A loader cannot beat reading its files front to back, nor (decoded, per
core) the decode of one image held in memory; these figures say which of
the two a loader is up against.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from dataset_bench.cache import BLOCK, CacheControl, sequential_read
from dataset_bench.measure import eval_transform
from dataset_bench.naive import naive_load
from dataset_bench.onecore import per_image_rates, single_core
from dataset_bench.results import median

__all__ = ["decode_rates", "measure_limits"]

MB = 1e6


def _jpeg_sample(files: Sequence[str | os.PathLike], limit: int) -> list[bytes]:
    out = []
    for f in files:
        data = Path(f).read_bytes()
        if data[:3] == b"\xff\xd8\xff":
            out.append(data)
            if len(out) >= limit:
                break
    return out


def _decode_steps(transform: Any) -> list[tuple[str, Callable[[bytes], Any]]]:
    """(name, per-image work on JPEG bytes) for :func:`decode_rates`."""
    from PIL import Image

    from readers.formats.base import to_chw
    from readers.decode.decoders import decode_rgb

    def pil(b: bytes) -> None:
        with Image.open(io.BytesIO(b)) as im:
            im.convert("RGB")

    def transformed(b: bytes) -> None:
        if getattr(transform, "accepts_bytes", False):
            transform(b)
        else:
            transform(to_chw(decode_rgb(b)))

    steps: list[tuple[str, Callable[[bytes], Any]]] = [("pil_decode", pil), ("decode_rgb", decode_rgb),
                                                       ("eval_transform", transformed)]
    if not getattr(transform, "accepts_bytes", False):
        steps.append(("eval_transform_bytes", transform))  # the transform's own fused decode, given bytes
    steps.append(("naive_item", lambda b: naive_load(io.BytesIO(b))))
    return steps


def _same(fn: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``per_image_rates`` makes each case's function anew: these steps are the functions themselves."""
    return fn


def decode_rates(files: Sequence[str | os.PathLike], *, limit: int = 300, transform: Any = None) -> dict[str, dict]:
    """Single-core rates over up to ``limit`` source JPEGs held in memory (no I/O in the timing).

    ``pil_decode``: ``Image.open(...).convert("RGB")`` (full decode);
    ``decode_rgb``: ``readers.decode.decoders.decode_rgb`` (the readers' decoder,
    ``auto``); ``eval_transform``: decode + resize + crop to 224 as the
    decoded mode runs it per sample (the readers hand the transform bytes
    only when it says ``accepts_bytes``; otherwise they decode first);
    ``eval_transform_bytes``: the transform called on the bytes itself
    (its fused, size-aware decode), when the readers do not do that;
    ``naive_item``: the baseline's per-file work minus the file read.
    Runs under :func:`dataset_bench.onecore.single_core` (one CPU, torch on one
    thread, both restored after); figures as :func:`dataset_bench.onecore.per_image_rates`.
    """
    blobs = _jpeg_sample(files, limit)
    if not blobs:
        return {}
    steps = _decode_steps(transform if transform is not None else eval_transform())
    with single_core():
        rates = per_image_rates([(functools.partial(_same, fn), blobs) for _name, fn in steps])
    return {name: r for (name, _fn), r in zip(steps, rates)}


def measure_limits(files: dict[str, list[Path]], source_files: Sequence[Path], *, repeats: int, cache: CacheControl,
                   transform: Any = None, decode_files: int = 300,
                   step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Sequential reads (cold, then warm) of each target's files and single-core decode rates, ``repeats`` times.

    ``files``: target name -> the files its reader reads. ``step(what)`` is
    called before each of the ``(2 * len(files) + 1) * repeats`` steps.
    Returns medians (and each repeat's value) as plain data.
    """
    reads: dict[str, dict[str, list]] = {}
    decodes: list[dict[str, dict]] = []
    for rep in range(repeats):
        for name, paths in files.items():
            for state in ("cold", "warm"):
                if step is not None:
                    step(f"[{rep + 1}/{repeats}] sequential read {name} {state}")
                reads.setdefault(name, {}).setdefault(state, []).append(sequential_read(paths, state == "cold", cache))
        if step is not None:
            step(f"[{rep + 1}/{repeats}] single-core decode")
        if source_files:
            decodes.append(decode_rates(source_files, limit=decode_files, transform=transform))
    seq: dict[str, dict[str, Any]] = {}
    for name, states in reads.items():
        seq[name] = {state: {"mb_per_s": median([r["mb_per_s"] for r in rs]), "mb": round(rs[0]["bytes"] / MB, 1),
                             "cached_before": median([r["cached_before"] for r in rs]),
                             "repeats": [r["mb_per_s"] for r in rs]}
                     for state, rs in states.items()}
        seq[name]["files"] = len(files[name])
    dec = {}
    for key in (decodes[0] if decodes else {}):
        dec[key] = {"images": decodes[0][key]["images"],
                    "images_per_s": median([d[key]["images_per_s"] for d in decodes]),
                    "mb_per_s": median([d[key]["mb_per_s"] for d in decodes]),
                    "repeats": [d[key]["images_per_s"] for d in decodes]}
    return {"sequential_read": seq, "decode_single_core": dec, "block_bytes": BLOCK}
