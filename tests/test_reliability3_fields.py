"""Issue 33 items 5, 7 and 8: typed fields of crafted datasets and shards.

* ``verify`` reads every extra field through the readers' own field access (``readers`` formats'
  ``field_blobs``): offsets past a blob, a column whose shape contradicts the schema and a short
  per-sample array make ``pack-dataset verify`` exit 1 with one line naming the sample and field,
  in every format, where the readers refuse the sample too.
* Header-declared sizes: a ``.npy`` member whose header claims 2**40 elements, a JSON value nested
  200,000 deep, a field type ``int32[²]`` or a 5,000-digit dimension are the one-line field or
  index errors, in the readers, ``verify``, ``convert`` and the WebDataset importer.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import make_image_folder
from packer.cli import main
from readers.contract import spec
from readers.contract.fields import FieldTypeError, FieldValueError, JsonType, parse_type
from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS, DatasetFormatError
from test_fields_read import pack_fields

N = 4
COLUMNS = {
    "caption": ("text", lambda i: f"caption {i}"),
    "tags": ("int32[3]", lambda i: [i, 1, 2]),
    "boxes": ("float32[*,4]", lambda i: [[i, 1, 2, 3]] * (i % 3 + 1)),
    "meta": ("json", lambda i: {"i": i}),
}
FIELDS = tuple(COLUMNS)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """format -> a small dataset with a text, a fixed array, a variable array and a json field."""
    root = tmp_path_factory.mktemp("r3-fields")
    src = make_image_folder(root / "src", classes=2, per_class=2, size=(20, 16), seed=3)
    images = sorted(p for d in sorted(src.iterdir()) if d.is_dir() for p in sorted(d.iterdir())
                    if p.suffix.lower() in (".jpeg", ".png"))[:N]
    return {fmt: pack_fields(images, [0, 0, 1, 1], root / fmt, fmt, COLUMNS) for fmt in FORMATS}


def _copy(packed: dict[str, Path], fmt: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(packed[fmt], tmp_path / fmt))


def _resize_in_index(root: Path, name: str) -> None:
    """index.json's recorded size of ``name`` set to the file's (a crafted dataset, not a truncated one)."""
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    meta["files"][name] = (root / name).stat().st_size
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))


def _verify(capsys, root: Path) -> tuple[int, list[str], str]:
    code = main(["verify", str(root), "-q"])
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line.startswith("DAMAGED")], err


def _items(ds):
    """Every item of a reader: random access, or the iteration of a wds reader."""
    import torch

    if isinstance(ds, torch.utils.data.IterableDataset):
        yield from ds
    else:
        for i in range(len(ds)):
            yield ds[i]


def _reader_refuses(root: Path, field: str) -> str:
    ds = open_dataset(root, fields=(field,))
    try:
        with pytest.raises(DatasetFormatError) as info:
            for _ in _items(ds):
                pass
        return str(info.value)
    finally:
        ds.close()


def _reader_reads(root: Path, field: str) -> None:
    ds = open_dataset(root, fields=(field,))
    try:
        assert len(list(_items(ds))) == N
    finally:
        ds.close()


# --------------------------------------------------------------------------- crafted datasets
def _offsets_past_blob(root: Path, fmt: str) -> tuple[str, int]:
    """The last caption's end offset moved 1,000 bytes past its blob (wds: its member's tar header
    says a megabyte more than the shard holds; lmdb: the value's key removed)."""
    if fmt == "mmap":
        off = np.load(root / "field-caption.offsets.npy")
        off[-1] += 1000
        np.save(root / "field-caption.offsets.npy", off)
    elif fmt == "hdf5":
        with h5py.File(root / "data.h5", "r+") as f:
            f["fields/caption/offsets"][-1] += 1000
    elif fmt == "lmdb":
        import lmdb

        env = lmdb.open(str(root / "data.mdb"), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            assert txn.delete(spec.lmdb_key(N - 1) + b"/caption")
        env.close()
    else:
        shard = sorted(root.glob("*.tar"))[-1]
        data = bytearray(shard.read_bytes())
        with tarfile.open(shard) as tar:
            m = max((m for m in tar.getmembers() if m.name.endswith(".caption.txt")), key=lambda m: m.offset)
        info = tarfile.TarInfo(m.name)
        info.size = m.size + 10**6
        info.mtime, info.mode, info.uid, info.gid = m.mtime, m.mode, m.uid, m.gid
        info.uname, info.gname = m.uname, m.gname
        data[m.offset:m.offset + 512] = info.tobuf(format=tarfile.USTAR_FORMAT)
        shard.write_bytes(bytes(data))
        return "caption", int(m.name.split(".")[0])
    return "caption", N - 1


def _shape_contradicts(root: Path, fmt: str) -> tuple[str, int]:
    """The fixed field ``tags`` (int32[3]) stored as (N, 3, 1): the same bytes, another shape."""
    tags = np.asarray([[i, 1, 2] for i in range(N)], dtype="<i4").reshape(N, 3, 1)
    if fmt == "hdf5":
        with h5py.File(root / "data.h5", "r+") as f:
            del f["fields/tags"]
            f.create_dataset("fields/tags", data=tags)
    else:
        np.save(root / "field-tags.npy", tags)
        _resize_in_index(root, "field-tags.npy")
    return "tags", 0


def _short_array(root: Path, fmt: str) -> tuple[str, int]:
    """A per-sample array one entry short: a variable field's offsets (mmap, hdf5), else a fixed
    field's column (wds, lmdb keep variable fields in members / keys)."""
    if fmt == "mmap":
        off = np.load(root / "field-caption.offsets.npy")
        np.save(root / "field-caption.offsets.npy", off[:-1])
        _resize_in_index(root, "field-caption.offsets.npy")
        return "caption", 0
    if fmt == "hdf5":
        with h5py.File(root / "data.h5", "r+") as f:
            off = f["fields/caption/offsets"][...]
            del f["fields/caption/offsets"]
            f.create_dataset("fields/caption/offsets", data=off[:-1])
        return "caption", 0
    np.save(root / "field-tags.npy", np.asarray([[i, 1, 2] for i in range(N - 1)], dtype="<i4"))
    _resize_in_index(root, "field-tags.npy")
    return "tags", 0


CRAFTED = {"offsets-past-blob": _offsets_past_blob, "shape-contradicts-schema": _shape_contradicts,
           "short-array": _short_array}


@pytest.mark.parametrize("case", list(CRAFTED))
@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_and_the_readers_refuse_the_same_crafted_field(packed, tmp_path, capsys, fmt, case):
    root = _copy(packed, fmt, tmp_path)
    field, i = CRAFTED[case](root, fmt)
    if fmt == "hdf5":  # h5py rewrote data.h5: its recorded size and chunk table no longer matter here
        _resize_in_index(root, "data.h5")
    msg = _reader_refuses(root, field)
    assert "\n" not in msg and field in msg, msg
    code, damaged, err = _verify(capsys, root)
    assert code == 1, (damaged, err)
    assert "Traceback" not in err, err
    lines = [d for d in damaged if f"field {field!r}" in d]
    assert len(lines) == 1, damaged
    assert f"sample {i}" in lines[0] and f"field {field!r}" in lines[0], lines


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_passes_what_every_reader_reads(packed, capsys, fmt):
    code, damaged, err = _verify(capsys, packed[fmt])
    assert code == 0 and not damaged, (damaged, err)
    for field in FIELDS:
        _reader_reads(packed[fmt], field)


# --------------------------------------------------------------------------- header-declared sizes (item 8)
def _npy(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=True)
    return out.getvalue()


def _npy_bomb(shape: tuple[int, ...] = (2**38, 4), dtype: str = "<f4", data: bytes = b"\0" * 32) -> bytes:
    """A .npy whose header claims ``shape`` (2**40 elements) before a few bytes of data."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False, "shape": shape})
    return out.getvalue() + data


def test_a_npy_member_claiming_2_40_elements_is_one_field_error_before_any_allocation():
    t = parse_type("float32[*,4]")
    with pytest.raises(FieldValueError, match=r"^field 'boxes' \(float32\[\*,4\]\): member does not parse \(32 data "
                                              r"bytes for 1099511627776 entries of 4\)$"):
        t.from_member(_npy_bomb(), "boxes")
    with pytest.raises(FieldValueError, match=r"holds Python objects"):
        t.from_member(_npy(np.array([None, 1], dtype=object)), "boxes")
    big = np.arange(8, dtype=">f4").reshape(2, 4)  # big-endian float32: read as the schema's <f4
    got = t.from_member(_npy(big), "boxes")
    assert got.dtype == np.dtype("<f4") and got.tolist() == big.tolist()
    with pytest.raises(FieldValueError, match=r"member holds float64 \(<f8\), not float32 \(<f4\)"):
        t.from_member(_npy(np.zeros((1, 4), ">f8").astype("<f8")), "boxes")


def _member_of(root: Path, suffix: str, i: int) -> tuple[Path, tarfile.TarInfo]:
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name == f"{spec.wds_key(i)}.{suffix}":
                    return shard, m
    raise AssertionError(f"no member {suffix} of sample {i}")


def _write_member(shard: Path, m: tarfile.TarInfo, data: bytes) -> None:
    """``data`` in place of member ``m`` (of the same size: the tar header stays valid)."""
    assert len(data) == m.size, (len(data), m.size)
    raw = bytearray(shard.read_bytes())
    raw[m.offset_data:m.offset_data + m.size] = data
    shard.write_bytes(bytes(raw))


def test_a_wds_npy_bomb_is_one_line_in_the_reader_verify_and_convert(packed, tmp_path, capsys):
    root = _copy(packed, "wds", tmp_path)
    shard, m = _member_of(root, "boxes.npy", 1)
    bomb = _npy_bomb()
    _write_member(shard, m, bomb + b"\0" * (m.size - len(bomb)))  # the header claims 2**40 float32
    msg = _reader_refuses(root, "boxes")
    assert "\n" not in msg and "sample 1 field 'boxes'" in msg and "entries of 4" in msg, msg
    code, damaged, err = _verify(capsys, root)
    assert code == 1 and "Traceback" not in err, err
    assert any("sample 1 field 'boxes': cannot be read" in d and "1099511627776 entries" in d for d in damaged), damaged
    code = main(["convert", str(root), "-f", "mmap", "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "sample 1 field 'boxes': cannot be read" in err, err


def test_json_nested_200000_deep_is_the_fields_one_line_error(packed, tmp_path, capsys):
    with pytest.raises(ValueError, match="nested too deeply"):
        JsonType().decode(b"[" * 200_000 + b"]" * 200_000)
    root = _copy(packed, "mmap", tmp_path)
    deep = b"[" * 200_000 + b"]" * 200_000
    (root / "field-meta.bin").write_bytes(deep * N)
    np.save(root / "field-meta.offsets.npy", np.arange(N + 1, dtype="<i8") * len(deep))
    _resize_in_index(root, "field-meta.bin")
    msg = _reader_refuses(root, "meta")
    assert "\n" not in msg and "sample 0 field 'meta': stored JSON is nested too deeply to parse" in msg, msg
    code, damaged, err = _verify(capsys, root)
    assert code == 1 and "Traceback" not in err, err
    lines = [d for d in damaged if "field 'meta'" in d]
    assert len(lines) == N and all(f"sample {i} field 'meta': cannot be read" in line and "nested too deeply"
                                   in line for i, line in enumerate(lines)), lines


@pytest.mark.parametrize("bad", ["int32[\u00b2]", "int32[" + "9" * 5000 + "]", "int32[\u0663]"],
                         ids=["superscript-2", "5000-digits", "arabic-indic-3"])
def test_a_bad_dimension_in_index_json_is_one_index_line(packed, tmp_path, capsys, bad):
    root = _copy(packed, "lmdb", tmp_path)
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    next(f for f in meta["fields"] if f["name"] == "tags")["type"] = bad
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))
    with pytest.raises(DatasetFormatError) as info:
        open_dataset(root)
    msg = str(info.value)
    assert "\n" not in msg and "index.json" in msg and "field 'tags'" in msg and "bad dim" in msg and len(msg) < 400
    code = main(["verify", str(root), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "bad dim" in err and "Traceback" not in err, err
    with pytest.raises(FieldTypeError):
        parse_type(bad)


# --------------------------------------------------------------------------- WebDataset import (item 5)
def _shards(folder: Path, samples: list[tuple[str, bytes]]) -> Path:
    """One shard of samples ``key`` -> (a real JPEG, ``key.boxes.npy`` = the bytes given)."""
    from conftest import REAL_IMAGES

    jpeg = (REAL_IMAGES / "people" / "grace_hopper.jpg").read_bytes()
    folder.mkdir(parents=True)
    with tarfile.open(folder / "shard-0.tar", "w") as tar:
        for key, npy in samples:
            for name, data in ((f"{key}.jpg", jpeg), (f"{key}.boxes.npy", npy)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return folder


def _rejects(out: Path) -> list[str]:
    return [json.loads(line)["reason"] for line in (out / spec.REJECTS_NAME).read_text().splitlines()]


def test_wds_import_rejects_a_npy_bomb_and_an_object_array_in_one_line_each(tmp_path, capsys):
    good = [_npy(np.arange(4 * (i + 1), dtype="<f4").reshape(-1, 4)) for i in range(3)]
    bomb = _npy_bomb()
    assert len(bomb) < 200
    src = _shards(tmp_path / "shards", [("s0", good[0]), ("s1", bomb), ("s2", good[1]),
                                        ("s3", _npy(np.array([None, 1], dtype=object))), ("s4", good[2])])
    out = tmp_path / "out"
    code = main([str(src), "-f", "mmap", "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err, err  # done, rows rejected
    reasons = _rejects(out)
    assert len(reasons) == 2 and all("\n" not in r for r in reasons), reasons
    assert "shard-0.tar:s1.boxes.npy: not a .npy array of numbers (32 data bytes for 1099511627776 entries" \
           in reasons[0], reasons
    assert "shard-0.tar:s3.boxes.npy: not a .npy array of numbers (it holds Python objects" in reasons[1], reasons
    ds = open_dataset(out, fields=("boxes",))
    try:
        assert [ds[i][0].tolist() for i in range(len(ds))] == [np.load(io.BytesIO(g)).tolist() for g in good]
    finally:
        ds.close()


def test_wds_import_reads_big_endian_npy_members_as_the_schemas_little_endian(tmp_path, capsys):
    arrays = [(np.arange(4 * (i + 1)).reshape(-1, 4) / 3).astype(">f4") for i in range(3)]
    src = _shards(tmp_path / "shards", [(f"s{i}", _npy(a)) for i, a in enumerate(arrays)])
    out = tmp_path / "out"
    code = main([str(src), "-f", "wds", "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 0, err
    meta = json.loads((out / spec.INDEX_NAME).read_text())
    assert {"name": "boxes", "type": "float32[*,4]"} in meta["fields"]
    ds = open_dataset(out, fields=("boxes",), shuffle=False)
    try:
        got = sorted((x[0] for x in ds), key=len)
    finally:
        ds.close()
    assert all(g.dtype == np.dtype("<f4") and g.tolist() == a.astype("<f4").tolist() for g, a in zip(got, arrays, strict=True))
    assert main(["verify", str(out), "-q"]) == 0
