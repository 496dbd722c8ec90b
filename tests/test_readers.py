"""Readers: round trip of every format, open_dataset dispatch and errors, lazy handles, damage, scale."""

from __future__ import annotations

import gc
import json
import os
import pickle
import shutil
import tarfile
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_image_folder
from packer import PackOptions, pack
from readers.contract import spec
from readers.contract.perprocess import PerProcess
from readers.formats.wds import ShardDataset
from readers.formats.registry import READERS, open_dataset
from readers.contract.spec import FORMATS, DatasetFormatError, IncompleteDatasetError
from reference import expected_rgb, pil_rgb

MAP_FORMATS = [f for f in FORMATS if f != "wds"]
def fds() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def items_of(ds) -> list[tuple]:
    """Every item of a reader (any format), sorted by sample index (needs return_index=True)."""
    items = list(ds) if isinstance(ds, torch.utils.data.IterableDataset) else [ds[i] for i in range(len(ds))]
    return sorted(items, key=lambda t: t[-1])


def raw(data) -> bytes:
    """An undecoded item as bytes: a 1-D uint8 tensor, or ``bytes`` itself."""
    if isinstance(data, bytes):
        return data
    assert isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 1, type(data)
    return data.numpy().tobytes()


def hwc(image: torch.Tensor) -> np.ndarray:
    assert image.dtype == torch.uint8 and image.dim() == 3 and image.shape[0] == 3, (image.dtype, image.shape)
    return image.permute(1, 2, 0).numpy()


def assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert diff.mean() < 2.0 and (diff > 40).mean() < 0.005, f"{what}: mean |diff| {diff.mean():.2f}"


@pytest.fixture(scope="module")
def plain_rgb_cache():
    cache: dict[Path, np.ndarray] = {}

    def get(path: Path) -> np.ndarray:
        if path not in cache:
            cache[path] = pil_rgb(path)
        return cache[path]

    return get


def _dataset_and_source(request, which: str, fmt: str) -> tuple[Path, Path]:
    root = request.getfixturevalue(f"packed_{which}")[fmt]
    src = request.getfixturevalue("real_images" if which == "real" else "generated")
    return Path(root), Path(src)


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("which", ["real", "generated"])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_round_trip_decoded_equals_pil(request, which, fmt, stored_bytes, plain_rgb_cache):
    root, src_root = _dataset_and_source(request, which, fmt)
    index = spec.read_index(root)
    names = list(index.names())
    kw = {"shuffle": False} if fmt == "wds" else {}
    ds = open_dataset(root, return_index=True, **kw)
    items = items_of(ds)
    assert [t[2] for t in items] == list(range(index.num_samples))
    assert index.num_samples == len(names) == len(index.labels)
    changed = 0
    for image, label, i in items:
        src = src_root / names[i]
        what = f"{fmt} sample {i} ({names[i]})"
        assert isinstance(label, int) and label == int(index.labels[i])
        assert index.classes[label] == names[i].split("/")[0], what
        got = hwc(image)
        plain = plain_rgb_cache(src)
        if fmt == "mmap":
            stored = np.frombuffer(stored_bytes(root, i), np.uint8)
            assert np.array_equal(got.reshape(-1), stored), what
            if not np.array_equal(got, plain):  # normalized at pack time (alpha, EXIF, ...)
                changed += 1
                assert_close(got, expected_rgb(src), what)
            continue
        data = stored_bytes(root, i)
        if data == src.read_bytes():
            assert np.array_equal(got, plain), f"{what}: original bytes stored, decode differs from PIL"
        else:
            changed += 1
            assert np.array_equal(got, pil_rgb(data)), f"{what}: decode differs from PIL's decode of the stored bytes"
            assert_close(got, expected_rgb(src), what)
    if fmt != "mmap":
        assert changed == index.meta["stats"]["reencoded"]
    if which == "generated":
        assert changed == 0  # plain RGB JPEG/PNG: stored byte for byte


@pytest.mark.parametrize("which", ["real", "generated"])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_undecoded_items_are_the_stored_bytes(request, which, fmt, stored_bytes):
    root, _ = _dataset_and_source(request, which, fmt)
    kw = {"shuffle": False} if fmt == "wds" else {}
    ds = open_dataset(root, decode=False, return_index=True, **kw)
    items = items_of(ds)
    assert len(items) == spec.read_index(root).num_samples
    for data, label, i in items:
        assert raw(data) == stored_bytes(root, i), f"{fmt} sample {i}"
    if fmt != "mmap":  # the checksums in the index are of the stored bytes
        sums = spec.read_index(root).arrays["checksums"]
        assert [spec.checksum(stored_bytes(root, i)) for i in range(len(items))] == sums.tolist()


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_transform_gets_decoded_chw_uint8(packed_generated, fmt):
    seen = []

    def transform(image):
        seen.append((image.dtype, tuple(image.shape)))
        return image.float().div(255)

    root = packed_generated[fmt]
    kw = {"shuffle": False} if fmt == "wds" else {}
    plain = items_of(open_dataset(root, return_index=True, **kw))
    done = items_of(open_dataset(root, return_index=True, transform=transform, **kw))
    assert len(seen) == len(plain) == len(done)
    for (a, la, ia), (b, lb, ib), (dtype, shape) in zip(plain, done, seen):
        assert dtype == torch.uint8 and len(shape) == 3 and shape[0] == 3
        assert (la, ia) == (lb, ib) and b.dtype == torch.float32
        assert torch.equal(b, a.float().div(255))


# --------------------------------------------------------------------------- dispatch and errors


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_open_dataset_dispatches_on_stored_format(packed_generated, fmt):
    ds = open_dataset(packed_generated[fmt])
    assert type(ds) is READERS[fmt] and ds.format == fmt
    assert ds.meta["format"] == fmt and ds.classes == spec.read_index(packed_generated[fmt]).classes


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_wrong_reader_class_fails_clearly(packed_generated, fmt):
    other = READERS[FORMATS[(FORMATS.index(fmt) + 1) % len(FORMATS)]]
    with pytest.raises(DatasetFormatError) as info:
        other(packed_generated[fmt])
    msg = str(info.value)
    assert repr(fmt) in msg and repr(other.format) in msg and other.__name__ in msg and "open_dataset" in msg


# --------------------------------------------------------------------------- the shared index


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_open_dataset_reads_the_index_once_and_shares_it(packed_generated, monkeypatch, fmt):
    calls = []
    real = spec.read_index

    def counting(root):
        calls.append(root)
        return real(root)

    monkeypatch.setattr(spec, "read_index", counting)
    ds = open_dataset(packed_generated[fmt])
    assert len(calls) == 1, f"open_dataset read the index {len(calls)} times"
    index = ds.index
    assert isinstance(index, spec.Index) and index.format == fmt
    assert ds.meta is index.meta and ds.labels is index.labels and ds.classes == index.classes
    assert ds.root == index.root == Path(packed_generated[fmt])
    assert set(index.arrays) == set(spec.REQUIRED_ARRAYS[fmt])
    again = open_dataset(index)  # an index already read: no second read
    direct = READERS[fmt](index)
    assert len(calls) == 1 and again.index is index and direct.index is index
    for reader in (ds, again, direct):
        reader.close()


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_reader_from_index_reads_like_reader_from_path(packed_generated, fmt):
    root = packed_generated[fmt]
    kw = {"shuffle": False} if fmt == "wds" else {}
    by_path = items_of(open_dataset(root, decode=False, return_index=True, **kw))
    by_index = items_of(READERS[fmt](spec.read_index(root), decode=False, return_index=True, **kw))
    assert [(raw(d), label, i) for d, label, i in by_index] == [(raw(d), label, i) for d, label, i in by_path]


def test_wrong_reader_for_an_index_fails_clearly(packed_generated):
    index = spec.read_index(packed_generated["hdf5"])
    with pytest.raises(DatasetFormatError, match=r"'hdf5' dataset; MemmapDataset reads 'mmap'"):
        READERS["mmap"](index)


def test_wds_public_shard_accessors_agree_with_the_index(packed_generated):
    ds = ShardDataset(packed_generated["wds"], shuffle=False, decode=False, return_index=True)
    shards = ds.index.arrays["shards"]
    covered = []
    for k, name in enumerate(ds.shard_names):
        samples = ds.samples_of_shard(k)
        assert ds.shard_path(k) == ds.root / name and ds.shard_path(k).is_file()
        assert len(samples) == ds.shard_sizes[k] and all(ds.shard_of(i) == k for i in samples)
        assert (shards[list(samples)] == k).all()
        covered += list(samples)
    assert covered == list(range(len(shards)))  # shard by shard, in sample order
    assert [t[2] for t in ds] == covered


@pytest.mark.parametrize("fmt", MAP_FORMATS)
def test_map_readers_name_their_data_file(packed_generated, fmt):
    ds = open_dataset(packed_generated[fmt])
    assert ds.data_file == Path(packed_generated[fmt]) / spec.DATA_FILE[fmt] and ds.data_file.is_file()
    assert ds.data_file.name in ds.meta["files"]


@pytest.mark.slow
def test_spec_and_perprocess_import_no_torch():
    import subprocess
    import sys

    code = "import sys, readers.contract.spec, readers.contract.perprocess; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_index(root: Path, **changes) -> None:
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    meta.update(changes)
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))


def test_folder_without_index(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match="not a packed dataset.*index.json"):
        open_dataset(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such dataset folder"):
        open_dataset(tmp_path / "missing")


def test_wrong_spec_version_names_both(packed_generated, tmp_path):
    root = _copy(packed_generated["lmdb"], tmp_path / "ds")
    _edit_index(root, spec_version=99)
    with pytest.raises(DatasetFormatError) as info:
        open_dataset(root)
    msg = str(info.value)
    assert "spec_version 99" in msg and f"version {spec.SPEC_VERSION}" in msg


def test_unknown_format(packed_generated, tmp_path):
    root = _copy(packed_generated["hdf5"], tmp_path / "ds")
    _edit_index(root, format="zarr")
    with pytest.raises(DatasetFormatError, match="unknown format 'zarr'"):
        open_dataset(root)


def test_half_written_pack_says_resume(packed_generated, tmp_path):
    root = _copy(packed_generated["wds"], tmp_path / "ds")
    (root / spec.INDEX_NAME).unlink()
    (root / spec.STATE_NAME).write_text("{}")
    with pytest.raises(IncompleteDatasetError, match="--resume"):
        open_dataset(root)


class Crash(Exception):
    pass


def test_interrupted_real_pack_is_refused(generated, tmp_path, monkeypatch):
    """A pack that dies part-way (here: the writer fails on the 5th sample) leaves no index.json."""
    from packer.formats.lmdb import LmdbWriter

    calls = []
    append = LmdbWriter.append

    def failing(self, sample_no, prepared, label):
        calls.append(sample_no)
        if len(calls) == 5:
            raise Crash("the machine went away")
        return append(self, sample_no, prepared, label)

    monkeypatch.setattr(LmdbWriter, "append", failing)
    with pytest.raises(Crash):
        pack(generated, tmp_path / "out", PackOptions(format="lmdb", workers=1))
    assert not (tmp_path / "out" / spec.INDEX_NAME).exists()
    with pytest.raises(IncompleteDatasetError, match="--resume"):
        open_dataset(tmp_path / "out")


def test_multi_split_folder_lists_splits(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src / "train", classes=2, per_class=2)
    make_image_folder(src / "val", classes=2, per_class=1, seed=1)
    pack(src, tmp_path / "out", PackOptions(format="mmap", workers=1))
    with pytest.raises(DatasetFormatError) as info:
        open_dataset(tmp_path / "out")
    assert "train" in str(info.value) and "val" in str(info.value)
    assert len(open_dataset(tmp_path / "out" / "val")) == 2


# --------------------------------------------------------------------------- lazy handles


def _handles(ds) -> list[PerProcess]:
    return [v for v in vars(ds).values() if isinstance(v, PerProcess)]


def _first(ds):
    return next(iter(ds)) if isinstance(ds, torch.utils.data.IterableDataset) else ds[3]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_constructor_opens_nothing_and_close_releases(packed_generated, fmt):
    before = fds()
    ds = open_dataset(packed_generated[fmt], return_index=True)
    assert fds() == before, "the constructor left a file open"
    assert all(h.peek() is None and h.owner is None for h in _handles(ds))
    if fmt == "wds":
        it = iter(ds)
        next(it)
        assert fds() == before + 1  # one shard open while iterating
        it.close()
        assert fds() == before
        assert len(list(ds)) == len(ds)
        assert fds() == before  # a finished epoch closes its shards
        return
    ds[3], ds[5]
    assert fds() == before + 1 and any(h.peek() is not None for h in _handles(ds))
    ds.close()
    assert fds() == before
    ds.close()  # twice is fine
    assert ds[3][2] == 3  # and it re-opens on demand
    ds.close()
    assert fds() == before


def _digest(item) -> tuple:
    image, label, i = item
    return i, label, zlib.crc32(image.numpy().tobytes())  # decoded CHW tensor


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_handles_reopen_in_forked_child(packed_generated, fmt):
    ds = open_dataset(packed_generated[fmt], return_index=True, **({"shuffle": False} if fmt == "wds" else {}))
    parent = _digest(_first(ds))  # the parent's handle is open now
    expected = [_digest(t) for t in items_of(ds)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: read everything, report, never return into pytest
        code = 1
        try:
            os.close(r)
            got = [_digest(t) for t in items_of(ds)]
            opened = [h for h in _handles(ds) if h.owner is not None]
            mine = all(h.owner == os.getpid() for h in opened) and (fmt == "wds" or bool(opened))
            os.write(w, pickle.dumps((got, mine)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "child failed"
    got, mine = pickle.loads(data)
    assert got == expected
    assert mine, "the child used the parent's handle instead of opening its own"
    assert all(h.owner in (None, os.getpid()) for h in _handles(ds))
    assert _digest(_first(ds)) == parent  # the parent's handle still works after the child exited
    ds.close()


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_pickle_drops_handles(packed_generated, fmt):
    ds = open_dataset(packed_generated[fmt], return_index=True, **({"shuffle": False} if fmt == "wds" else {}))
    expected = [_digest(t) for t in items_of(ds)]  # used: handles open
    copy = pickle.loads(pickle.dumps(ds))
    assert all(h.owner is None for h in _handles(copy))
    assert [_digest(t) for t in items_of(copy)] == expected
    copy.close()
    ds.close()


# --------------------------------------------------------------------------- structural damage


def _wds_sample(root: Path, shard: int, k: int) -> tuple[int, Path, int]:
    """(sample index, shard path, header byte position) of the k-th sample of a shard."""
    index = spec.read_index(root)
    s = index.meta["shards"][shard]
    i = s["first"] + k
    return i, root / s["name"], int(index.arrays["offsets"][i]) - spec.TAR_BLOCK


def _iter_all(root: Path) -> list:
    return list(ShardDataset(root, shuffle=False, decode=False))


def test_wds_truncated_shard_names_shard_and_offset(packed_generated, tmp_path):
    root = _copy(packed_generated["wds"], tmp_path / "ds")
    i, shard, header = _wds_sample(root, 1, 2)
    os.truncate(shard, header + spec.TAR_BLOCK + 10)  # cut inside sample i's data
    with pytest.raises(DatasetFormatError) as info:
        _iter_all(root)
    msg = str(info.value)
    assert shard.name in msg and f"byte {header}" in msg and f"sample {i}" in msg and "truncated" in msg


@pytest.mark.parametrize("where,flip", [(3, 0x20), (124 + 9, 0x01)], ids=["name-byte", "size-digit"])
def test_wds_corrupt_header_byte_names_shard_and_offset(packed_generated, tmp_path, where, flip):
    root = _copy(packed_generated["wds"], tmp_path / "ds")
    i, shard, header = _wds_sample(root, 2, 1)
    with open(shard, "r+b") as f:
        f.seek(header + where)  # a byte of the member name / an octal digit of the size field
        b = f.read(1)
        f.seek(header + where)
        f.write(bytes([b[0] ^ flip]))
    with pytest.raises(DatasetFormatError) as info:
        _iter_all(root)
    msg = str(info.value)
    assert shard.name in msg and f"byte {header}" in msg and f"sample {i}" in msg


def test_wds_header_of_another_sample_is_caught(packed_generated, tmp_path):
    """A well-formed header that does not match the index (shards swapped or rewritten)."""
    root = _copy(packed_generated["wds"], tmp_path / "ds")
    i, shard, header = _wds_sample(root, 0, 1)
    with open(shard, "r+b") as f:
        f.seek(header)
        old = tarfile.TarInfo.frombuf(f.read(spec.TAR_BLOCK), "utf-8", "strict")
        info = tarfile.TarInfo(spec.wds_key(i + 100) + ".jpg")
        info.size = old.size
        f.seek(header)
        f.write(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
    with pytest.raises(DatasetFormatError, match=f"{shard.name} at byte {header}.*does not match its index"):
        _iter_all(root)


def _break_offset(root: Path, i: int) -> None:
    offsets = np.load(root / spec.array_file("offsets"))
    offsets[i] = 10**9
    spec.save_array(root, "offsets", offsets)
    # as in a dataset packed before index.json recorded array checksums: the range check must catch it
    meta = json.loads((root / spec.INDEX_NAME).read_text())
    del meta[spec.ARRAYS_KEY]
    (root / spec.INDEX_NAME).write_text(json.dumps(meta))


@pytest.mark.parametrize("fmt", ["hdf5", "mmap"])
def test_offsets_past_the_end(packed_generated, tmp_path, fmt):
    root = _copy(packed_generated[fmt], tmp_path / "ds")
    _break_offset(root, 4)
    with pytest.raises(DatasetFormatError, match=r"offsets.npy: sample 4: .*past the end of the data"):
        open_dataset(root)  # refused on open, before any read is computed from it


def test_mmap_truncated_data_file(packed_generated, tmp_path):
    root = _copy(packed_generated["mmap"], tmp_path / "ds")
    data = root / spec.DATA_FILE["mmap"]
    os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(DatasetFormatError, match=data.name):
        open_dataset(root)[0]


def test_lmdb_missing_sample(packed_generated, tmp_path):
    import lmdb

    root = _copy(packed_generated["lmdb"], tmp_path / "ds")
    env = lmdb.open(str(root), subdir=True)
    with env.begin(write=True) as txn:
        assert txn.delete(spec.lmdb_key(6))
    env.close()
    ds = open_dataset(root)
    with pytest.raises(DatasetFormatError, match="sample 6 .*missing"):
        ds[6]
    ds.close()


def test_index_out_of_range(packed_generated):
    ds = open_dataset(packed_generated["lmdb"], return_index=True)
    assert ds[-1][2] == len(ds) - 1
    with pytest.raises(IndexError):
        ds[len(ds)]
    ds.close()


# --------------------------------------------------------------------------- scale: ImageNet-sized index

N_BIG = 1_281_167  # ImageNet-1k train


def _synthetic_index(root: Path, fmt: str) -> None:
    """An index for 1.28M samples with tiny or sparse data files (readers open data lazily)."""
    root.mkdir()
    n = N_BIG
    rng = np.random.default_rng(0)
    sizes = rng.integers(20_000, 200_000, n)
    arrays = {"labels": np.repeat(np.arange(1000), n // 1000 + 1)[:n], "checksums": rng.integers(0, 2**32, n),
              "sizes": sizes}
    meta = {"format": fmt, "num_samples": n, "classes": [f"n{c:08d}" for c in range(1000)],
            "storage": {"kind": "pixels" if fmt == "mmap" else "encoded", "fixed_shape": None}}
    if fmt == "wds":
        per = -(-n // 500)
        shards = np.minimum(np.arange(n) // per, 499)
        first = np.searchsorted(shards, np.arange(500))
        counts = np.bincount(shards, minlength=500)
        arrays["shards"] = shards
        arrays["offsets"] = np.full(n, spec.TAR_BLOCK, np.int64)  # never read here
        meta["shards"] = [{"name": f"train-{s:06d}.tar", "samples": int(counts[s]), "first": int(first[s]),
                           "bytes": 1 << 20, "crc32": 0} for s in range(500)]
        for s in meta["shards"]:
            (root / s["name"]).touch()
    else:
        arrays["offsets"] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if fmt == "mmap":
        arrays["heights"] = np.full(n, 375)
        arrays["widths"] = np.full(n, 500)
        with open(root / spec.DATA_FILE["mmap"], "wb") as f:  # sparse
            f.truncate(1 << 30)
    spec.write_index(root, meta, arrays)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_imagenet_sized_index_opens_fast_and_small(tmp_path, fmt, capsys):
    root = tmp_path / fmt
    _synthetic_index(root, fmt)
    gc.collect()
    before = fds()
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        ds = open_dataset(root)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fds() == before
    arrays = {k: v for k, v in vars(ds).items() if isinstance(v, np.ndarray)}
    arrays.update({f"index.arrays[{k}]": v for k, v in ds.index.arrays.items()})
    unique = {id(a.base if a.base is not None else a): a for a in arrays.values()}
    total = sum(a.nbytes for a in unique.values())
    per_sample = [k for k, v in vars(ds).items() if isinstance(v, (list, tuple, dict, set)) and len(v) >= 10_000]
    with capsys.disabled():
        print(f"\n[1.28M index] {fmt}: open_dataset {seconds * 1000:.0f} ms, index arrays "
              f"{total / 2**20:.1f} MiB, traced peak {peak / 2**20:.1f} MiB")
    assert len(ds) == N_BIG if fmt != "wds" else ds.samples_per_rank(1) == N_BIG
    assert total < 64 * 2**20, f"index arrays take {total / 2**20:.1f} MiB"
    assert peak < 80 * 2**20, f"constructing allocated {peak / 2**20:.1f} MiB"
    assert not per_sample, f"per-sample Python containers: {per_sample}"
