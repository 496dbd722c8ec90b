"""COCO instances (``instances_*.json`` + an images folder) as one record per image.

Each image becomes a sample with the fields of :data:`COCO_SCHEMA`::

    image         image         the file ``<images>/<file_name>``
    image_id      int           COCO's image id
    file_name     text          as the json names it
    boxes         float32[*,4]  one row per annotation, [x, y, width, height] as COCO stores them
    category_ids  int32[*]      the annotations' category ids (id -> name stored as the field's classes)
    areas         float32[*]    COCO's ``area`` (width * height of the box where it is missing)
    iscrowd       uint8[*]      0 or 1 (0 where it is missing)
    segmentation  json          the list of the annotations' ``segmentation`` (polygons or RLE), as stored

An image without annotations gives arrays of length 0 (``boxes`` of shape (0, 4)). Images
are yielded in the order of the json's ``images`` list; annotations of an image in their
order in the file. The row number of an image is its position in ``images`` + 1.

Memory: the whole json is parsed with :func:`json.load` (instances_train2017.json is 448 MB
and takes a few GB of Python objects while it is parsed; a streaming JSON parser would add a
dependency for a file that fits in memory on any machine that trains on it). The annotations
are then turned into a few numpy columns (ids, boxes, areas, ...) sorted by image id once,
each image's annotations a slice of them (``np.searchsorted``), so the per-annotation dicts
are freed; only the segmentation objects are kept, in one list.

Errors: a json that cannot be read (nested more than ``MAX_JSON_DEPTH`` levels, an integer past
Python's int-str limit or a key given twice in one object, each named by where it is, e.g.
``annotations[3].bbox``), an image or category id past int64 (category ids: int32), an annotation
whose ``image_id`` matches no image or whose ``category_id`` matches no category, a box not of 4
numbers, or one with a NaN or infinite value or a negative width or height -- each a
:class:`~packer.errors.SourceError` naming the file and the annotation id, before anything is
packed. An image whose file is missing, or whose ``file_name`` leaves the images folder (an absolute
path, ``..``), is a per-row :class:`~packer.importers.manifest.RowReject`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from packer.errors import SourceError
from packer.importers.manifest import Row, RowReject
from readers.contract.fields import Field, FieldValueError, ImageType, JsonType, NumericType, Schema, TextType
from readers.contract.jsontext import JSON_ERRORS, json_loads, json_locate, json_problem, json_too_deep
from readers.contract.messages import one_line
from readers.contract.safeio import check_member_name
from readers.contract.spec import DatasetFormatError

__all__ = ["CocoInstances", "read_coco", "coco_schema", "is_coco_instances"]

log = logging.getLogger(__name__)

_INSTANCES_RE = re.compile(r"instances_(.+)\.json\Z")


def coco_schema(categories: dict[int, str] | None = None) -> Schema:
    """The fields of a COCO sample; ``categories`` (id -> name) become ``category_ids``' classes."""
    return Schema((
        Field("image", ImageType()),
        Field("image_id", NumericType("int64")),
        Field("file_name", TextType()),
        Field("boxes", NumericType("float32", (None, 4))),
        Field("category_ids", NumericType("int32", (None,)), dict(categories or {})),
        Field("areas", NumericType("float32", (None,))),
        Field("iscrowd", NumericType("uint8", (None,))),
        Field("segmentation", JsonType()),
    ))


def is_coco_instances(path: str | os.PathLike) -> bool:
    """True for a file named like COCO's instances annotations (``instances_<split>.json``)."""
    return bool(_INSTANCES_RE.match(Path(path).name))


class CocoInstances:
    """A parsed instances json: :attr:`schema`, :attr:`categories` and :meth:`rows` (one per image)."""

    def __init__(self, path: Path, images_dir: Path, images: list[dict[str, Any]], categories: list[dict[str, Any]],
                 columns: dict[str, np.ndarray], segmentation: list[Any], starts: np.ndarray,
                 ends: np.ndarray) -> None:
        self.path = path
        self.images_dir = images_dir
        #: the json's categories as stored (id, name, supercategory, ...)
        self.categories = categories
        self.schema = coco_schema({c["id"]: c["name"] for c in categories})
        self.num_images = len(images)
        self.num_annotations = len(segmentation)
        self._images = images
        self._columns = columns  # sorted by image id
        self._segmentation = segmentation
        self._starts, self._ends = starts, ends

    def __repr__(self) -> str:
        return (f"CocoInstances({str(self.path)!r}, {self.num_images} images, {self.num_annotations} annotations, "
                f"{len(self.categories)} categories)")

    def describe(self) -> dict[str, Any]:
        """JSON-able record for index.json's ``source``."""
        return {"kind": "coco", "file": self.path.name, "images": self.num_images,
                "annotations": self.num_annotations, "categories": self.categories}

    def rows(self) -> Iterator[Row | RowReject]:
        """Each image in the json's order: a :class:`Row`, or a :class:`RowReject` (missing file)."""
        for i, im in enumerate(self._images):
            row = i + 1
            name = im.get("file_name")
            if not isinstance(name, str) or not name:
                yield RowReject(str(self.path), row, "file_name", f"image id {im['id']}: no file_name")
                continue
            try:
                check_member_name(name)
            except DatasetFormatError:
                yield RowReject(str(self.path), row, "file_name", f"image id {im['id']}: file_name {_short(name)} "
                                f"leaves the images folder {self.images_dir} (absolute paths, '..', '.' and empty parts are "
                                f"refused)")
                continue
            p = self.images_dir / name
            if not p.is_file():
                yield RowReject(str(self.path), row, "file_name", f"image id {im['id']}: {p} not found", str(p))
                continue
            lo, hi = int(self._starts[i]), int(self._ends[i])
            c = self._columns
            raw = {"image_id": im["id"], "file_name": name, "boxes": c["boxes"][lo:hi],
                   "category_ids": c["category_ids"][lo:hi], "areas": c["areas"][lo:hi],
                   "iscrowd": c["iscrowd"][lo:hi], "segmentation": self._segmentation[lo:hi]}
            values = {}
            if json_too_deep(raw["segmentation"]):
                yield RowReject(str(self.path), row, "segmentation",
                                f"image id {im['id']}: {json_problem(RecursionError())}", str(p))
                continue
            try:
                for f in self.schema.fields[1:]:
                    values[f.name] = f.type.check(raw[f.name], f.name)
            except FieldValueError as exc:
                yield RowReject(str(self.path), row, f.name, f"image id {im['id']}: {exc.reason}",
                                str(p))
                continue
            yield Row(row, str(p), values)


def _default_images_dir(path: Path) -> Path | None:
    """COCO's layout: ``annotations/instances_val2017.json`` beside ``val2017/``."""
    m = _INSTANCES_RE.match(path.name)
    if not m:
        return None
    for d in (path.parent.parent / m.group(1), path.parent / m.group(1)):
        if d.is_dir():
            return d
    return None


def _column(anns: list[dict[str, Any]], key: str, dtype: Any, default: Any, path: Path) -> np.ndarray:
    """One numeric value per annotation; a SourceError naming the first annotation without a usable one."""
    try:
        values = [a[key] for a in anns] if default is None else [a.get(key, default) for a in anns]
        arr = np.array(values)  # numbers only: no dtype given, so "3" or None is not quietly converted
        kinds = "biuf" if np.dtype(dtype).kind == "f" else "iu"  # ids: integers, not 3.0 or 3.7
        if arr.dtype.kind in kinds and arr.ndim == 1 and len(arr) == len(anns):
            return arr.astype(dtype)
    except (KeyError, TypeError, ValueError, OverflowError):
        pass
    for i, a in enumerate(anns):  # the slow path, only to name the culprit
        v = a.get(key, default)
        want = (int, float) if np.dtype(dtype).kind == "f" else int
        if not isinstance(v, want) or isinstance(v, bool):
            raise SourceError(f"{path}: {_ann(a, i)}: {key!r} is {'missing' if v is None else repr(v)}; "
                              f"expected {'a number' if want is not int else 'an integer'}")
        if not _fits(v, dtype):
            raise SourceError(f"{path}: {_ann(a, i)}: {key!r} is {_short(v)}, out of range for {np.dtype(dtype).name}")
    raise SourceError(f"{path}: annotations: {key!r} values do not fit {np.dtype(dtype).name}")


def _fits(v: int | float, dtype: Any) -> bool:
    """Whether the JSON number ``v`` fits ``dtype`` (an int dtype: in range; a float one: finite as float64)."""
    if np.dtype(dtype).kind == "f":
        try:
            return not isinstance(v, int) or math.isfinite(float(v))
        except OverflowError:
            return False
    info = np.iinfo(dtype)
    return info.min <= v <= info.max


def _boxes(anns: list[dict[str, Any]], path: Path) -> np.ndarray:
    if not anns:
        return np.zeros((0, 4), np.float64)
    try:
        boxes = np.array([a["bbox"] for a in anns])
        if boxes.dtype.kind in "iuf" and boxes.ndim == 2 and boxes.shape[1] == 4:
            return boxes.astype(np.float64)
    except (KeyError, TypeError, ValueError):
        pass
    for i, a in enumerate(anns):
        b = a.get("bbox")
        if not isinstance(b, list) or len(b) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                             for v in b):
            what = "missing" if b is None else f"{b!r:.60} (expected [x, y, width, height])"
            raise SourceError(f"{path}: {_ann(a, i)}: bbox is {what}")
        if not all(_fits(v, np.float64) for v in b):
            raise SourceError(f"{path}: {_ann(a, i)}: bbox {_short(b)} holds a number past float64")
    raise SourceError(f"{path}: annotations: bbox values are not numbers")  # pragma: no cover - caught above


def _float32(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # a coordinate past 3.4e38 becomes inf, as float32 holds it
        return np.ascontiguousarray(values, dtype=np.float32)


def _short(value: Any) -> str:
    return one_line(repr(value), 60)


def _ann(a: Any, i: int) -> str:
    return f"annotation id {a['id']}" if isinstance(a, dict) and "id" in a else f"annotation #{i} (no id)"


def read_coco(path: str | os.PathLike, images: str | os.PathLike | None = None) -> CocoInstances:
    """Parse a COCO instances json; ``images``: the folder of the image files (default: COCO's layout,
    ``<root>/<split>/`` beside ``<root>/annotations/instances_<split>.json``)."""
    p = Path(path)
    if not p.is_file():
        raise SourceError(f"{p}: no such COCO annotations file")
    if images is None:
        images_dir = _default_images_dir(p)
        if images_dir is None:
            raise SourceError(f"{p}: where are the images? name their folder with --images")
    else:
        images_dir = Path(images)
        if not images_dir.is_dir():
            raise SourceError(f"{images_dir}: --images must be the folder of the COCO images")
    try:
        with open(p, "rb") as f:
            raw = f.read()
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.load does
        del raw
        data = json_loads(text)  # a key given twice in one object raises, as in a JSONL manifest
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{p}: not a COCO json ({exc})") from None
    except JSON_ERRORS as exc:  # nested too deep, a huge integer, a key twice: say where
        found = json_locate(text, levels=3)
        keys, why = found if found is not None else ([], exc)
        place = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" if n else str(k) for n, k in enumerate(keys))
        raise SourceError(f"{p}: {place or 'the json'}: {json_problem(why)}") from None
    del text
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise SourceError(f"{p}: not a COCO instances json (no 'images' list)")
    ims, anns = data["images"], data.get("annotations") or []
    cats = data.get("categories") or []
    if not isinstance(anns, list) or not isinstance(cats, list):
        raise SourceError(f"{p}: 'annotations' and 'categories' must be lists")
    del data

    for i, c in enumerate(cats):
        if not (isinstance(c, dict) and isinstance(c.get("id"), int) and isinstance(c.get("name"), str)):
            raise SourceError(f"{p}: categories[{i}] needs an integer 'id' and a string 'name'")
        if not _fits(c["id"], np.int32):
            raise SourceError(f"{p}: categories[{i}]: id {_short(c['id'])} is out of range for int32 (category ids "
                              f"must fit int32)")
    cat_ids = np.array([c["id"] for c in cats], dtype=np.int64)
    if len(np.unique(cat_ids)) != len(cat_ids):
        raise SourceError(f"{p}: category ids repeat")
    for i, im in enumerate(ims):
        if not (isinstance(im, dict) and isinstance(im.get("id"), int) and not isinstance(im.get("id"), bool)):
            raise SourceError(f"{p}: images[{i}] has no integer 'id'")
        if not _fits(im["id"], np.int64):
            raise SourceError(f"{p}: images[{i}]: id {_short(im['id'])} is out of range for int64")
    im_ids = np.array([im["id"] for im in ims], dtype=np.int64)
    uniq, counts = np.unique(im_ids, return_counts=True)
    if (counts > 1).any():
        raise SourceError(f"{p}: image id {int(uniq[counts > 1][0])} is given more than once in 'images'")

    for i, a in enumerate(anns):
        if not isinstance(a, dict):
            raise SourceError(f"{p}: annotations[{i}] is not an object")
    ids = _column(anns, "image_id", np.int64, None, p)
    cat = _column(anns, "category_id", np.int64, None, p)
    boxes = _boxes(anns, p)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(_float32(boxes)).all(axis=1) | (boxes[:, 2] < 0) | (boxes[:, 3] < 0))
    if bad.size:
        i = int(bad[0])
        b = boxes[i]
        wrong = ("holds NaN or infinity" if not np.isfinite(b).all() else
                 "has a negative width or height" if b[2] < 0 or b[3] < 0 else "is out of range for float32")
        raise SourceError(f"{p}: {_ann(anns[i], i)}: bbox {_short(anns[i]['bbox'])} {wrong} (expected [x, y, width, "
                          f"height], finite, width and height >= 0)"
                          + (f" ({bad.size} annotations like it)" if bad.size > 1 else ""))
    area = _column(anns, "area", np.float64, math.nan, p)
    crowd = _column(anns, "iscrowd", np.int64, 0, p)
    seg = [a.get("segmentation") for a in anns]

    bad = np.flatnonzero(~np.isin(ids, im_ids))
    if bad.size:
        i = int(bad[0])
        raise SourceError(f"{p}: {_ann(anns[i], i)}: image_id {int(ids[i])} matches no image"
                          + (f" ({bad.size} annotations like it)" if bad.size > 1 else ""))
    bad = np.flatnonzero(~np.isin(cat, cat_ids))
    if bad.size:
        i = int(bad[0])
        raise SourceError(f"{p}: {_ann(anns[i], i)}: category_id {int(cat[i])} matches no category")
    bad = np.flatnonzero((crowd != 0) & (crowd != 1))
    if bad.size:
        i = int(bad[0])
        raise SourceError(f"{p}: {_ann(anns[i], i)}: iscrowd is {int(crowd[i])}, expected 0 or 1")
    missing_area = np.isnan(area)
    area[missing_area] = boxes[missing_area, 2] * boxes[missing_area, 3]
    del anns

    order = np.argsort(ids, kind="stable")  # annotations of one image keep their file order
    sorted_ids = ids[order]
    columns = {
        "boxes": _float32(boxes[order]),
        "category_ids": cat[order].astype(np.int32),
        "areas": _float32(area[order]),
        "iscrowd": crowd[order].astype(np.uint8),
    }
    segmentation = [seg[i] for i in order.tolist()]
    starts = np.searchsorted(sorted_ids, im_ids, side="left")
    ends = np.searchsorted(sorted_ids, im_ids, side="right")
    log.info("%s: %d images, %d annotations, %d categories", p, len(ims), len(seg), len(cats))
    return CocoInstances(p, images_dir, ims, cats, columns, segmentation, starts, ends)
