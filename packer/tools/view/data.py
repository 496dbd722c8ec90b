"""What the view shows, read through the readers: the overview (``info``'s :func:`describe`), pages of
sample indices (index order, or shuffled with a seed; filtered by class), one sample's fields, its
thumbnail (the readers' reduced-scale decode) and the pack's ``rejects.jsonl``.

Opening reads ``index.json`` and opens one reader (``open_dataset``: the index arrays mapped, no
sample read, no names file, no scan of the samples); a sample is read by random access when a page
asks for it. Samples are named by split and index only: nothing in a request is ever a path.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packer.tools.info import describe
from readers.contract import spec
from readers.contract.messages import one_line
from readers.contract.safeio import member_path, open_regular
from readers.decode.decoders import decode_rgb_scaled, read_header, reduction_for

__all__ = ["DatasetView", "Split", "THUMB", "png_bytes", "thumbnail_pixels", "box_names"]

#: thumbnails are decoded at the largest DCT scale that keeps both sides at least this many pixels
THUMB = 128
_SHOWN_ITEMS = 64  # an array field shows this many values on a sample page
_REJECT_THUMBS = 24  # rejects with a thumbnail, per reason
_REJECT_BYTES = 64 << 20  # a rejected source file larger than this gets no thumbnail
_REJECT_PIXELS = 40_000_000  # nor one whose reduced-scale decode would be larger (a decompression bomb)
_NAME_STRIDE = 4096  # names.jsonl: one line start kept per this many lines
_REMOTE_NAMES_BYTES = 16 << 20  # a remote names.jsonl is read for a sample page only up to this size
_READ_ERRORS = (spec.DatasetFormatError, OSError, ValueError, KeyError, IndexError)


def png_bytes(pixels: np.ndarray) -> bytes:
    """``pixels`` (H, W, 3 uint8) as a lossless PNG."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels), "RGB").save(out, format="PNG", compress_level=1)
    return out.getvalue()


def thumbnail_pixels(data: Any, size: int = THUMB) -> np.ndarray:
    """The thumbnail of a stored image (``reader.read(i)``): a JPEG decoded at the DCT scale 1/2, 1/4
    or 1/8 that keeps both sides >= ``size`` (the readers' reduced-scale decode), then every k-th
    pixel down to about ``size``; other images and mmap pixels at full scale, then every k-th pixel."""
    if isinstance(data, np.ndarray) and data.ndim == 3:
        pixels = data
    else:
        header = read_header(data)
        scale = reduction_for(header.height, header.width, size, size, jpeg=header.is_jpeg)
        pixels = decode_rgb_scaled(data, scale, header=header)
    step = max(1, min(pixels.shape[:2]) // size)
    return np.ascontiguousarray(pixels[::step, ::step])


def _affine(n: int, seed: int) -> tuple[int, int]:
    """(a, b) with gcd(a, n) == 1: ``(a * k + b) % n`` is a permutation of range(n), made in O(1)
    (a shuffled grid of a 100M-sample index needs no 100M-entry permutation)."""
    if n <= 1:
        return 1, 0
    rng = np.random.default_rng(seed)
    a = int(rng.integers(1, n))
    while math.gcd(a, n) != 1:
        a = a % (n - 1) + 1
    return a, int(rng.integers(0, n))


class Order(Sequence):
    """The samples a grid pages through: ``base`` (a range, or one class's indices) in index order, or
    permuted by ``(a * k + b) % n``."""

    def __init__(self, base: Sequence[int] | np.ndarray, seed: int | None) -> None:
        self.base = base
        self.a, self.b = (1, 0) if seed is None else _affine(len(base), seed)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        return int(self.base[(self.a * k + self.b) % len(self.base)])


def box_names(boxes: Any, values: dict[str, Any], schema: Any) -> list[dict[str, Any]]:
    """COCO xywh boxes (a ``boxes`` field of shape (N, 4)) with their category names (the first
    integer field of N values that has class names, e.g. ``category_ids``)."""
    if not isinstance(boxes, np.ndarray) or boxes.ndim != 2 or boxes.shape[1] != 4:
        return []
    names = [""] * len(boxes)
    for f in schema:
        v = values.get(f.name)
        if f.classes and isinstance(v, np.ndarray) and v.shape == (len(boxes),):
            names = [f.classes.get(int(c), str(int(c))) for c in v]
            break
    return [{"x": float(b[0]), "y": float(b[1]), "w": float(b[2]), "h": float(b[3]), "name": n}
            for b, n in zip(boxes, names)]


def _shown(type_name: str, v: Any) -> dict[str, Any]:
    """A field's value as a sample page shows it: arrays with shape and dtype, json pretty-printed."""
    if isinstance(v, np.ndarray):
        text = json.dumps(v.reshape(-1)[:_SHOWN_ITEMS].tolist() if v.size > _SHOWN_ITEMS else v.tolist())
        return {"shape": list(v.shape), "dtype": str(v.dtype), "text": text + (" …" if v.size > _SHOWN_ITEMS else "")}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"text": f"{len(v)} bytes"}
    if type_name == "json":
        return {"text": json.dumps(v, indent=2, ensure_ascii=False)}
    return {"text": str(v)}


def _reason_kind(reason: str) -> str:
    """A reject's reason without its detail ("corrupt JPEG header (Truncated File Read)" -> the head)."""
    return reason.split(" (", 1)[0].split(": ", 1)[0][:120] or "?"


class Split:
    """One packed dataset (one split) opened for viewing: its reader and its :func:`describe` entry."""

    def __init__(self, name: str, desc: dict[str, Any]) -> None:
        from readers.formats.registry import open_dataset  # imports torch: only when viewing

        self.name, self.desc = name, desc
        others = tuple(str(f["name"]) for f in desc["fields"] if f["name"] != "image")
        self.reader = open_dataset(desc["path"], decode=False, fields=others or None)
        self.others = others if self.reader.fields is not None else ()
        self.schema = self.reader.schema
        self.samples = len(self.reader.labels)
        self.has_label = "label" in self.schema and spec.has_label(self.reader.meta)
        self.text = next((f.name for f in self.schema if f.type.name == "text"), None)
        self.second_images = [f.name for f in self.schema if f.name != "image" and f.type.name == "image"]
        self.chart: str | None = None  # the class histogram (SVG), made by the first overview
        self.name_marks: np.ndarray | None = None  # where every 4096th line of names.jsonl starts

    def close(self) -> None:
        self.reader.close()
        if self.reader.index.store is not None:  # a remote dataset: its connections now
            self.reader.index.store.close()

    def indices(self, label: int | None = None, seed: int | None = None) -> Order:
        """The samples a grid pages through: all, or those of class ``label`` (one pass over the labels
        array, only when a class is asked for); shuffled with ``seed``."""
        if label is None:
            return Order(range(self.samples), seed)
        return Order(np.flatnonzero(np.asarray(self.reader.labels) == label), seed)

    def class_name(self, label: int) -> str:
        classes = self.reader.classes
        return str(classes[label]) if 0 <= label < len(classes) else str(label)

    def label(self, i: int) -> int | None:
        return int(self.reader.labels[i]) if self.has_label else None

    def values(self, i: int) -> dict[str, Any]:
        """Every field of sample ``i`` but the image, as the readers decode them (random access)."""
        if not self.others:
            return {}
        item = self.reader.get(i) if self.reader.format == "wds" else self.reader[i]
        return dict(zip(self.others, item))

    def caption(self, i: int, values: dict[str, Any]) -> str:
        """The text under a thumbnail: the class name and the first text field."""
        label = self.label(i)
        parts = [self.class_name(label)] if label is not None else []
        if self.text is not None:
            parts.append(str(values[self.text]))
        return " · ".join(parts)

    def cell(self, i: int) -> dict[str, Any]:
        """A grid cell: sample ``i``'s thumbnail pixels and caption, or its one-line error."""
        try:
            values = self.values(i)
            return {"index": i, "pixels": thumbnail_pixels(self.reader.read(i)), "caption": self.caption(i, values),
                    "error": None}
        except _READ_ERRORS as exc:
            return {"index": i, "pixels": None, "caption": "", "error": self._error(i, exc)}

    def _error(self, i: int, exc: BaseException) -> str:
        text = one_line(exc, first=True)
        where = self.reader.where(i)
        return text if where in text else f"{where} sample {i}: {text}"

    def image(self, i: int, field: str = "image") -> tuple[bytes, str]:
        """The full image of ``field`` of sample ``i``: (bytes, content type); JPEG and PNG as stored."""
        data = self.reader.read(i) if field == "image" else self.values(i)[field]
        if isinstance(data, np.ndarray) and data.ndim == 3:
            return png_bytes(data), "image/png"
        blob = bytes(data)
        if blob[:3] == b"\xff\xd8\xff":
            return blob, "image/jpeg"
        if blob[:8] == b"\x89PNG\r\n\x1a\n":
            return blob, "image/png"
        return png_bytes(decode_rgb_scaled(blob, 1)), "image/png"

    def source_name(self, i: int) -> str | None:
        """Sample ``i``'s source path from ``names.jsonl`` (None when the dataset has none). Local: found
        through a table of where every 4096th line starts, made by the first sample page (one pass over
        the file's bytes, ~0.1 s per million lines); remote: read up to line ``i`` (a small file only)."""
        try:
            if self.reader.remote is not None:
                size = (self.reader.meta.get("files") or {}).get(spec.NAMES_FILE)
                if size is None or size > _REMOTE_NAMES_BYTES:
                    return None
                with contextlib.closing(self.reader.index.names()) as names:
                    return next(itertools.islice(names, i, None), None)
            path = member_path(self.reader.root, spec.NAMES_FILE, "names file")
            if not path.is_file():
                return None
            with os.fdopen(open_regular(path, "names file"), "rb") as f:
                if self.name_marks is None:
                    self.name_marks = _line_marks(f)
                f.seek(int(self.name_marks[i // _NAME_STRIDE]))
                for _ in range(i % _NAME_STRIDE):
                    f.readline()
                name = json.loads(f.readline())
            return name if isinstance(name, str) else f"(not a name: {name!r:.60})"
        except (*_READ_ERRORS, IndexError) as exc:
            return f"(unreadable: {one_line(exc)})"

    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i`` for its page: every field shown, boxes with category names, where it lives."""
        arrays = self.reader.index.arrays
        out: dict[str, Any] = {"split": self.name, "index": i, "key": f"{self.name}/{i}", "where": self.reader.where(i),
                               "crc32": f"{int(arrays['checksums'][i]):08x}" if "checksums" in arrays else None,
                               "size": int(arrays["sizes"][i]) if "sizes" in arrays else None,
                               "source": self.source_name(i), "second_images": self.second_images}
        label = self.label(i)
        if label is not None:
            out["label"], out["class"] = label, self.class_name(label)
        try:
            stored = self.reader.read(i)
            if isinstance(stored, np.ndarray):  # mmap: the pixels
                out["height"], out["width"] = stored.shape[:2]
            else:
                header = read_header(stored)
                out["height"], out["width"] = header.height, header.width
            values = self.values(i)
        except _READ_ERRORS as exc:
            out.update(error=self._error(i, exc), fields=[], boxes=[], caption="")
            return out
        out["fields"] = [{"name": f.name, "type": f.type.name, **_shown(f.type.name, values[f.name])}
                         for f in self.schema if f.name in values]
        out["caption"] = self.caption(i, values)
        out["boxes"] = box_names(values.get("boxes"), values, self.schema)
        return out

    def rejects(self) -> dict[str, list[dict[str, Any]]]:
        """``rejects.jsonl`` of a local pack grouped by reason; each row with a thumbnail (PNG bytes)
        where its source file (under the pack's source folder) still decodes."""
        root = self.reader.root
        if self.reader.remote is not None or not (Path(root) / spec.REJECTS_NAME).is_file():
            return {}
        source = (self.desc.get("source") or {}).get("root")
        groups: dict[str, list[dict[str, Any]]] = {}
        with open(Path(root) / spec.REJECTS_NAME, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(r, dict):
                    continue
                path, reason = str(r.get("path", "?")), str(r.get("reason", "?"))
                rows = groups.setdefault(_reason_kind(reason), [])
                thumb = _source_thumbnail(Path(source), path) if source and len(rows) < _REJECT_THUMBS else None
                rows.append({"path": path, "reason": reason, "thumb": thumb})
        return groups


def _line_marks(f: Any) -> np.ndarray:
    """Byte offsets of lines 0, 4096, 8192, ... of the open file ``f``, in one pass over its bytes."""
    marks, count, pos = [np.zeros(1, np.int64)], 0, 0
    while chunk := f.read(16 << 20):
        starts = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10).astype(np.int64) + pos + 1  # of the next lines
        lines = np.arange(count + 1, count + 1 + len(starts))
        marks.append(starts[lines % _NAME_STRIDE == 0])
        count, pos = count + len(starts), pos + len(chunk)
    return np.concatenate(marks)


def _source_thumbnail(source: Path, rel: str) -> bytes | None:
    """A PNG thumbnail of the rejected source file ``source/rel``, or None: outside ``source``, gone,
    too large (in bytes, or in pixels at the reduced scale: the header is read first), or not
    decodable (most rejects)."""
    try:
        path = (source / rel).resolve()
        if not path.is_relative_to(source.resolve()) or not path.is_file() or path.stat().st_size > _REJECT_BYTES:
            return None
        data = path.read_bytes()
        header = read_header(data)
        scale = reduction_for(header.height, header.width, THUMB, THUMB, jpeg=header.is_jpeg)
        if (header.height // scale) * (header.width // scale) > _REJECT_PIXELS:
            return None
        return png_bytes(thumbnail_pixels(data))
    except (OSError, ValueError, RuntimeError):
        return None


class DatasetView:
    """A packed dataset (or a folder / prefix of split datasets) opened for viewing."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.desc = describe(path)
        entries = self.desc["splits"] if "splits" in self.desc else [self.desc]
        self.splits: dict[str, Split] = {}
        try:
            for k, d in enumerate(entries):
                if d.get("state") != "complete":
                    raise spec.DatasetFormatError(f"{d['path']}: an interrupted pack (pack-dataset info {d['path']} "
                                                  "says how to resume it); view shows complete datasets")
                name = str(d.get("split") or str(d["path"]).rstrip("/").rsplit("/", 1)[-1] or f"split{k}")
                while name in self.splits:
                    name += "_"
                self.splits[name] = Split(name, d)
        except BaseException:
            self.close()
            raise

    def split(self, name: str | None) -> Split:
        """The split ``name`` (the first when None); KeyError when it is not one of them."""
        if not name:
            return next(iter(self.splits.values()))
        return self.splits[name]

    def close(self) -> None:
        for s in self.splits.values():
            s.close()

    def __enter__(self) -> DatasetView:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
