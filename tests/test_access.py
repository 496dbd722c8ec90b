"""The data-access layer of ``readers``: one location parser, one size parser, one index resolver,
checked open / range read, index arrays memory-mapped (shared page cache, checksums still
verified), one ByteBatch builder, and no module reaching into another's objects' privates."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from readers.contract import spec
from readers.contract.location import UnsupportedLocationError, parse_location
from readers.formats.resolve import resolve_index
from readers.contract.units import format_size, parse_size

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- locations
@pytest.mark.parametrize("text,expected", [
    ("out/train-wds", Path("out/train-wds")),
    ("/data/x", Path("/data/x")),
    ("file:///abs/path", Path("/abs/path")),
    ("FILE://localhost/abs/path", Path("/abs/path")),
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("https://host:8080/a/b", "https://host:8080/a/b"),
    ("HTTP://host/a", "HTTP://host/a"),
])
def test_parse_location_serves_paths_file_s3_http(text, expected):
    assert parse_location(text) == expected and type(parse_location(text)) is type(expected)


@pytest.mark.parametrize("text", ["oci://b/x", "wasb://c/x", "hf://datasets/x", "adl://c@a/x", "ftp://h/x"])
def test_parse_location_refuses_other_schemes_naming_them(text):
    with pytest.raises(UnsupportedLocationError) as err:
        parse_location(text)
    scheme = text.split("://")[0]
    message = str(err.value)
    assert "\n" not in message and f"the {scheme}:// scheme is not supported" in message
    assert "s3://, gs://, az://, abfs://, http://, https://" in message and "file://" in message
    with pytest.raises(UnsupportedLocationError):
        spec.is_remote(text)  # no right answer: neither a local folder nor a served URL


def test_file_url_with_a_host_is_refused():
    with pytest.raises(UnsupportedLocationError, match="absolute local path"):
        parse_location("file://otherhost/x")


@pytest.mark.parametrize("text", ["oci://b/x", "wasb://c/x", "hf://d/x"])
def test_open_dataset_refuses_unsupported_schemes(text):
    from readers import open_dataset

    with pytest.raises(UnsupportedLocationError, match=f"{text.split('://')[0]}:// scheme is not supported"):
        open_dataset(text)


def test_open_dataset_serves_file_urls(packed_generated):
    from readers import open_dataset

    root = Path(packed_generated["lmdb"]).resolve()
    ds = open_dataset(f"file://{root}", decode=False)
    try:
        assert ds.root == root and len(ds) == spec.read_index(root).num_samples
        assert ds.read(0) == open_dataset(root, decode=False).read(0)
    finally:
        ds.close()
    assert resolve_index(f"file://{root}").root == root


def test_resolve_index_takes_a_folder_an_index_or_a_store(packed_generated):
    from readers.remote import open_store

    root = Path(packed_generated["wds"])
    index = resolve_index(root)
    assert resolve_index(index) is index
    via_store = resolve_index(open_store(root))
    assert via_store.num_samples == index.num_samples
    assert via_store.arrays["offsets"].tolist() == index.arrays["offsets"].tolist()


# ---------------------------------------------------------------------------- sizes
def test_one_size_parser_with_binary_units():
    from packer.options import parse_size as cli_size
    from readers.remote.config import parse_size as cache_size

    for parse in (parse_size, cli_size, cache_size):
        assert parse("256MB") == parse("256MiB") == parse("256m") == 256 * 2**20 == 268_435_456
        assert parse("200GB") == 200 * 2**30 and parse("1.5GiB") == 3 * 2**29 and parse("500k") == 500 * 1024
        assert parse("2T") == 2 * 2**40 and parse(4096) == parse("4096") == 4096 and parse(" 1 kb ") == 1024
        for bad in ("lots", "5ib", "1e30GB", "inf", True):
            with pytest.raises(ValueError, match="not a size"):
                parse(bad)
        for negative in ("-1MB", "-1", -5):
            with pytest.raises(ValueError, match="must be at least 0 bytes"):
                parse(negative)
    for n in (1, 1000, 1024, 256 * 2**20, 3 * 2**30, 12345):
        assert parse_size(format_size(n)) == n


def test_cache_limit_and_shard_size_agree(tmp_path):
    """The node cache's limit and --shard-size read the same spelling as the same number of bytes."""
    from packer.options import PackOptions
    from readers.remote.cache import NodeCache

    assert NodeCache(tmp_path / "cache", limit="256MB").limit == 268_435_456  # was 256,000,000
    assert PackOptions(format="wds").shard_size == parse_size("256MB") == 268_435_456


# ---------------------------------------------------------------------------- checked I/O
def test_open_data_file_refuses_a_file_shorter_than_the_index(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 100)
    os.close(spec.open_data_file(path, 100))
    with pytest.raises(spec.DatasetFormatError, match=r"data\.bin: data file is 100 bytes, index\.json says 101: "
                                                      "it is truncated or damaged"):
        spec.open_data_file(path, 101)


def test_read_range_is_exact_or_names_the_place(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(bytes(range(256)) * 4)
    fd = spec.open_data_file(path)
    try:
        assert spec.read_range(fd, 10, 5, lambda: "never") == bytes(range(10, 15))
        with pytest.raises(spec.DatasetFormatError, match="shard.tar at byte 1000: cut short"):
            spec.read_range(fd, 1000, 100, lambda: f"{path} at byte 1000: cut short")
    finally:
        os.close(fd)


def test_the_data_file_size_check_is_written_once():
    """"data file shorter than the index": one implementation (safeio.open_data_file), not one per reader."""
    hits = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "readers").rglob("*.py")
                  if "truncated or damaged\"" in p.read_text() and "says {size}" in p.read_text())
    assert hits in (["readers/contract/safeio.py"], sorted(["readers/contract/safeio.py", "readers/formats/hdf5.py"])), hits


# ---------------------------------------------------------------------------- mapped index arrays
def _synthetic_wds_index(root: Path, n: int) -> Path:
    """An index-only wds dataset of ``n`` samples (no data files: read_index never opens them)."""
    root.mkdir(parents=True)
    arrays = {name: np.arange(n, dtype=spec.ARRAY_DTYPES[name]) for name in spec.REQUIRED_ARRAYS["wds"]}
    spec.write_index(root, {"format": "wds", "num_samples": n, "classes": ["a"], "shards": []}, arrays)
    return root


def _mapping_of(address: int) -> str | None:
    """The file mapped at ``address`` in this process (from /proc/self/maps), or None (anonymous memory)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else None
    return None


def test_index_arrays_are_mapped_read_only_from_their_files(tmp_path):
    root = _synthetic_wds_index(tmp_path / "ds", 10_000)
    index = spec.read_index(root)
    for name, arr in index.arrays.items():
        assert arr.tolist()[:3] == [0, 1, 2] and len(arr) == 10_000
        assert not arr.flags.writeable, name
        where = _mapping_of(arr.__array_interface__["data"][0])
        assert where == os.path.realpath(root / spec.array_file(name)), (name, where)


def test_mapped_index_arrays_hold_no_descriptor(tmp_path):
    root = _synthetic_wds_index(tmp_path / "ds", 1000)
    before = len(os.listdir("/proc/self/fd"))
    index = spec.read_index(root)
    assert len(os.listdir("/proc/self/fd")) == before
    del index


def test_a_flipped_byte_in_a_mapped_index_array_is_detected(tmp_path):
    root = _synthetic_wds_index(tmp_path / "ds", 5000)
    path = root / spec.array_file("offsets")
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40
    path.write_bytes(raw)
    with pytest.raises(spec.DatasetFormatError, match=r"offsets\.npy: checksum differs from the one index\.json"):
        spec.read_index(root)


def test_a_repack_renames_arrays_over_so_a_mapped_index_is_unchanged(tmp_path):
    root = _synthetic_wds_index(tmp_path / "ds", 1000)
    index = spec.read_index(root)
    arrays = {name: np.full(1000, 7, dtype=spec.ARRAY_DTYPES[name]) for name in spec.REQUIRED_ARRAYS["wds"]}
    spec.write_index(root, {"format": "wds", "num_samples": 1000, "classes": ["a"], "shards": []}, arrays)
    assert index.arrays["labels"].tolist() == list(range(1000))  # the old inode, still mapped
    assert spec.read_index(root).arrays["labels"].tolist() == [7] * 1000
    assert not list(root.glob("*.tmp"))


_ANON = r"""
import gc, sys
from readers.contract import spec

def anon_kb():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Anonymous:",)))

gc.collect()
before = anon_kb()
index = spec.read_index(sys.argv[1])
gc.collect()
print(anon_kb() - before, index.num_samples)
"""


@pytest.mark.slow  # a fresh interpreter per size
def test_private_memory_of_opening_an_index_does_not_grow_with_n(tmp_path):
    """Opening a 4M-sample wds index (112 MB of arrays) adds no more private memory than 250k:
    the arrays are the page cache's, not this process's (read into memory they cost 28 B/sample)."""
    grown = {}
    for n in (250_000, 4_000_000):
        root = _synthetic_wds_index(tmp_path / f"ds{n}", n)
        out = subprocess.run([sys.executable, "-c", _ANON, str(root)], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
        assert out.returncode == 0, out.stderr
        kb, samples = map(int, out.stdout.split())
        assert samples == n
        grown[n] = kb
    assert grown[4_000_000] < 8 * 1024, grown  # 8 MB: would be 109,375 KB if read into memory
    assert grown[4_000_000] - grown[250_000] < 4 * 1024, grown


# ---------------------------------------------------------------------------- one ByteBatch builder
def _calls(path: Path, name: str) -> list[int]:
    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def test_byte_batches_are_built_in_one_place():
    """Only ``readers.formats.batch.new_byte_batch`` calls the ByteBatch constructor."""
    found = {p.relative_to(ROOT).as_posix(): _calls(p, "ByteBatch") for p in (ROOT / "readers").rglob("*.py")}
    found = {k: v for k, v in found.items() if v}
    assert list(found) == ["readers/formats/batch.py"] and len(found["readers/formats/batch.py"]) == 2, found  # tensor or array


@pytest.mark.parametrize("alloc", ["pool", "array", "tensor"])
def test_new_byte_batch_writes_through_to_the_batch(alloc):
    import torch

    from readers.formats.batch import byte_batch, byte_offsets, new_byte_batch, shared_tensor

    chosen = {"pool": None, "array": lambda n: np.empty(n, dtype=np.uint8), "tensor": shared_tensor}[alloc]
    batch, data = new_byte_batch(byte_offsets([3, 0, 2]), chosen)
    data[:] = np.frombuffer(b"abcde", dtype=np.uint8)
    assert [batch.get(k) for k in range(len(batch))] == [b"abc", b"", b"de"]
    assert batch.offsets.dtype == torch.int64 and batch.data.dtype == torch.uint8
    if alloc == "tensor":
        assert batch.data.is_shared()
    again = byte_batch([b"abc", b"", b"de"], alloc=chosen)
    assert [again.get(k) for k in range(3)] == [b"abc", b"", b"de"]


# ---------------------------------------------------------------------------- no reaching into objects
@pytest.mark.parametrize("module", ["readers/formats/shardbatch.py", "packer/engines/io.py", "packer/tools/verify_remote.py"])
def test_modules_use_public_accessors_of_the_objects_they_are_given(module):
    """``shardbatch`` read ``ShardDataset._offsets``, ``engines/io`` ``store._path``/``_call``, and
    ``verify_remote`` ``verify._check_*``: each now uses a public name."""
    tree = ast.parse((ROOT / module).read_text())
    private = sorted({f"{n.value.id}.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id not in ("self", "cls")
                      and n.attr.startswith("_") and not n.attr.startswith("__")})
    imported = sorted(a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                      and n.module.split(".")[0] in ("packer", "readers") for a in n.names if a.name.startswith("_"))
    assert not private and not imported, (private, imported)


def test_remote_files_and_verify_read_recorded_sizes_one_way(packed_generated):
    """Sizes and CRC-32s a download or verify is checked against come from spec.recorded_files."""
    meta = json.loads((Path(packed_generated["wds"]) / spec.INDEX_NAME).read_text())
    recorded = spec.recorded_files(meta)
    for shard in meta["shards"]:
        assert recorded[shard["name"]] == (shard["bytes"], shard["crc32"])
    meta = json.loads((Path(packed_generated["lmdb"]) / spec.INDEX_NAME).read_text())
    name = spec.DATA_FILE["lmdb"]
    assert recorded_pair(meta, name) == (meta["files"][name], meta.get(spec.FILES_CRC_KEY, {}).get(name))


def recorded_pair(meta: dict, name: str) -> tuple:
    return spec.recorded_files(meta)[name]


# ---------------------------------------------------------------------------- pickled readers (spawn workers)
@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5", "mmap"])
def test_a_pickled_reader_maps_its_index_again_instead_of_carrying_it(packed_generated, fmt):
    """What a spawned (or forkserver) loader worker receives: the folder and metadata, not the
    arrays; the worker maps the same files (page cache), so no worker holds a private copy."""
    import pickle

    from readers import open_dataset

    ds = open_dataset(packed_generated[fmt], decode=False)
    try:
        blob = pickle.dumps(ds)
        arrays_bytes = sum(a.nbytes for a in ds.index.arrays.values())
        assert arrays_bytes > 0
        for name, arr in ds.index.arrays.items():
            assert arr.tobytes() not in blob or arr.nbytes < 64, f"{name} travelled in the pickle"
        other = pickle.loads(blob)
        try:
            assert other.labels is other.index.labels and other.index.arrays.keys() == ds.index.arrays.keys()
            for name, arr in other.index.arrays.items():
                assert _mapping_of(arr.__array_interface__["data"][0]) == os.path.realpath(
                    Path(packed_generated[fmt]) / spec.array_file(name)), name
                assert np.array_equal(arr, ds.index.arrays[name])
            a, b = other.read(0), ds.read(0)
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        finally:
            other.close()
    finally:
        ds.close()


def test_unpickling_after_a_repack_reads_the_new_index_or_refuses(tmp_path):
    import pickle

    root = _synthetic_wds_index(tmp_path / "ds", 1000)
    blob = pickle.dumps(spec.read_index(root))
    arrays = {name: np.arange(1000, dtype=spec.ARRAY_DTYPES[name]) for name in spec.REQUIRED_ARRAYS["wds"]}
    spec.write_index(root, {"format": "wds", "num_samples": 1000, "classes": ["a"], "shards": []}, arrays)
    again = pickle.loads(blob)  # same metadata, new files: read and checked again
    assert again.arrays["labels"].tolist() == list(range(1000))
    spec.write_index(root, {"format": "wds", "num_samples": 1000, "classes": ["b"], "shards": []}, arrays)
    with pytest.raises(spec.DatasetFormatError, match="changed since this reader was made"):
        pickle.loads(blob)


@pytest.mark.slow  # a pack, twice
def test_a_leftover_array_temp_file_does_not_block_overwrite(tmp_path):
    """Arrays are written as <name>.npy.tmp and renamed: one left by a killed pack is the pack's own file."""
    from conftest import make_image_folder
    from packer import PackOptions, pack

    src = make_image_folder(tmp_path / "src", classes=2, per_class=2)
    out = tmp_path / "out"
    pack(src, out, PackOptions(format="lmdb", workers=1))
    (out / (spec.array_file("labels") + ".tmp")).write_bytes(b"half an array")
    pack(src, out, PackOptions(format="lmdb", workers=1, overwrite=True))
    assert spec.read_index(out).num_samples == 4


_FD_LIMIT_SCRIPT = """
import os, resource, sys
from readers import open_dataset
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
ds = open_dataset(sys.argv[1], decode=False)  # opened; its data file is opened at the first read
held = []
try:
    while True:  # every descriptor the limit allows is taken
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    ds.read(0)
except Exception as exc:
    print(type(exc).__name__, exc, sep="|")
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_the_descriptor_limit_is_named_as_such_not_as_damage(packed_generated, fmt):
    """Under a real ``ulimit -n``, a reader that cannot open a data file says the process's limit was
    reached (an OSError naming the file and the limit), not that the dataset is damaged."""
    r = subprocess.run([sys.executable, "-c", _FD_LIMIT_SCRIPT, str(packed_generated[fmt])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    kind, _, message = r.stdout.strip().partition("|")
    assert kind == "OSError", r.stdout
    assert "too many open files" in message and "ulimit -n" in message and str(packed_generated[fmt]) in message
