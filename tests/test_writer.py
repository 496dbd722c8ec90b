"""``packer.Writer`` (issue 34 item 1): samples written from Python into each format read back field-exact
and verify; a bad sample is one error (or one reject line) naming its position and field; an exception in
the ``with`` block leaves no index; a write killed with SIGKILL and resumed is byte-identical to an
uninterrupted one; the recipe of docs/writing.md runs."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import PackError, PackOptions, SampleError, UsageError, Writer
from packer.cli import main as cli_main
from packer.tools.verify import verify
from readers import open_dataset
from readers.contract import spec
from readers.contract.locks import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("wds", "lmdb", "hdf5", "mmap")
FIELDS = ("image", "label", "caption", "boxes", "score")
N_WRITTEN = 2000  # issue 34: a generator of 2,000 samples, written into each format


def pixels(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (16 + i % 7, 24 + i % 5, 3), dtype=np.uint8)


def sample(i: int) -> dict:
    """Sample ``i``: the image as JPEG bytes, a PIL image or an array (in turn), a caption, boxes, a float."""
    arr = pixels(i)
    if i % 3 == 0:
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=90)
        image = buf.getvalue()
    else:
        image = Image.fromarray(arr) if i % 3 == 1 else arr
    return {"image": image, "label": i % 4, "caption": f"sample number {i}",
            "boxes": np.arange(4 * (i % 3), dtype=np.float32).reshape(-1, 4) + i, "score": i / 7}


def samples(n: int):
    return (sample(i) for i in range(n))


def opts(fmt: str) -> PackOptions:
    return PackOptions(format=fmt, shard_count=16, checkpoint_bytes=4096)


def read_back(out: Path) -> list[tuple]:
    ds = open_dataset(out, fields=FIELDS, decode=False, **({"shuffle": False, "pad": False}
                                                           if json.loads((out / spec.INDEX_NAME).read_text())[
                                                               "format"] == "wds" else {}))
    try:
        return list(ds) if not hasattr(ds, "__len__") or ds.format == "wds" else [ds[i] for i in range(len(ds))]
    finally:
        ds.close()


def assert_field_exact(out: Path, fmt: str, n: int) -> None:
    got = read_back(out)
    assert len(got) == n
    for i, (image, label, caption, boxes, score) in enumerate(got):
        want = sample(i)
        assert (label, caption, score) == (want["label"], want["caption"], want["score"]), i
        assert boxes.dtype == np.float32 and np.array_equal(boxes, want["boxes"]), i
        if fmt == "mmap":  # pixels: decoded once at write time
            h, w = pixels(i).shape[:2]
            if i % 3:
                assert bytes(image) == pixels(i).tobytes(), i
            else:
                assert len(image) == h * w * 3, i
        elif i % 3 == 0:
            assert bytes(image) == want["image"], i  # a valid JPEG is stored byte for byte
        else:
            with Image.open(io.BytesIO(bytes(image))) as im:  # a PIL image or array: a lossless PNG
                assert im.format == "PNG" and np.array_equal(np.asarray(im.convert("RGB")), pixels(i)), i


@pytest.mark.parametrize("fmt", FORMATS)
def test_samples_written_read_back_field_exact_and_verify(tmp_path, fmt):
    out = tmp_path / fmt
    with Writer(out, format=fmt, options=opts(fmt), classes=["a", "b", "c", "d"]) as w:
        for s in samples(N_WRITTEN):
            w.write(s)
        assert w.count == N_WRITTEN and not (out / spec.INDEX_NAME).exists()
    assert w.result is not None and w.result.images == N_WRITTEN
    meta = json.loads((out / spec.INDEX_NAME).read_text())
    assert meta["classes"] == ["a", "b", "c", "d"] and meta["num_samples"] == N_WRITTEN
    assert [(f["name"], f["type"]) for f in meta["fields"]] == [
        ("image", "image"), ("label", "int32"), ("caption", "text"), ("boxes", "float32[*,4]"), ("score", "float")]
    assert_field_exact(out, fmt, N_WRITTEN)
    assert verify(out).ok
    assert cli_main(["verify", str(out)]) == 0 and cli_main(["info", str(out)]) == 0
    assert not (out / spec.STATE_NAME).exists() and not (out / spec.REJECTS_NAME).exists()


def test_the_same_samples_through_pack_map_give_the_same_bytes_with_0_1_and_2_workers(tmp_path):
    """The 2,000 samples above, made by ``sample`` as pack_map's ``fn`` (one input, one sample), in 0,
    1 and 2 worker processes: every file of the output is the same, and it reads back field-exact."""
    from packer import pack_map

    got = {}
    for workers in (0, 1, 2):
        out = tmp_path / f"w{workers}"
        result = pack_map(sample, range(N_WRITTEN), out, "wds", workers=workers, options=opts("wds"),
                          classes=["a", "b", "c", "d"])
        assert result.inputs == result.samples == N_WRITTEN
        got[workers] = {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}
    assert spec.INDEX_NAME in got[0] and len(got[0]) > 3
    assert got[1] == got[0] and got[2] == got[0]
    assert_field_exact(tmp_path / "w2", "wds", N_WRITTEN)


def test_converted_writer_output_keeps_every_field(tmp_path):
    out, conv = tmp_path / "lmdb", tmp_path / "wds"
    with Writer(out, format="lmdb") as w:
        for s in samples(12):
            w.write(s)
    assert cli_main(["convert", str(out), "-f", "wds", "-o", str(conv)]) == 0
    assert_field_exact(conv, "wds", 12)


def test_a_bad_sample_is_one_error_naming_position_and_field(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SampleError, match=r"^sample 5: field 'boxes'") as info:
        with Writer(out, format="lmdb") as w:
            for i, s in enumerate(samples(10)):
                if i == 5:
                    s["boxes"] = np.zeros((2, 3), np.float32)  # not [*, 4]
                w.write(s)
    assert "\n" not in str(info.value)
    assert not (out / spec.INDEX_NAME).exists()
    with Writer(tmp_path / "img", format="wds") as w:
        w.write(sample(0))
        with pytest.raises(SampleError, match=r"^sample 1: field 'image': "):
            w.write(dict(sample(1), image=b"not an image at all"))
        with pytest.raises(SampleError, match=r"^sample 1: missing field 'caption'"):
            w.write({k: v for k, v in sample(1).items() if k != "caption"})
        w.write(sample(1))  # the writer goes on: the bad ones were not taken
    assert w.count == 2 and verify(tmp_path / "img").ok


@pytest.mark.parametrize("fmt", ["wds", "mmap"])
def test_on_error_reject_is_one_reject_line(tmp_path, fmt):
    out = tmp_path / "out"
    with Writer(out, format=fmt, on_error="reject") as w:
        for i, s in enumerate(samples(20)):
            w.write(dict(s, image=b"\xff\xd8 truncated") if i == 7 else s)
    assert w.count == 20 and w.result is not None and w.result.images == 19 and w.result.rejected == 1
    (line,) = (out / spec.REJECTS_NAME).read_text().splitlines()
    reject = json.loads(line)
    assert reject["path"] == "7" and re.match(r"sample 7: field 'image': ", reject["reason"]), reject
    assert verify(out).ok


def test_an_exception_in_the_with_block_leaves_no_index(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyError):
        with Writer(out, format="hdf5", options=opts("hdf5")) as w:
            for i, s in enumerate(samples(30)):
                w.write(s)
                if i == 20:
                    raise KeyError("the producer failed")
    assert not (out / spec.INDEX_NAME).exists() and (out / spec.STATE_NAME).exists()
    with pytest.raises(Exception):
        open_dataset(out)
    assert not (out / LOCK_NAME).exists()  # the pack lock is released


CHILD = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
from reliability_helpers import kill_once_checkpointed
from test_writer import opts, samples
from packer import Writer
w = Writer({out!r}, format={fmt!r}, options=opts({fmt!r}), classes=["a", "b", "c", "d"])
for i, s in enumerate(samples({n})):
    if i == {kill}:
        kill_once_checkpointed({state!r})
    w.write(s)
"""


def tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "mmap"])
def test_a_write_killed_with_sigkill_resumes_byte_identical(tmp_path, fmt):
    # killed after sample 130 was given, once a checkpoint (a shard of 16, or 4 KB) is durable
    n, kill = 150, 130
    whole, cut = tmp_path / "whole" / "out", tmp_path / "cut" / "out"
    with Writer(whole, format=fmt, options=opts(fmt), classes=["a", "b", "c", "d"]) as w:
        for s in samples(n):
            w.write(s)
    child = CHILD.format(tests=str(ROOT / "tests"), root=str(ROOT), out=str(cut), fmt=fmt, n=n, kill=kill,
                         state=str(cut / spec.STATE_NAME))
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (cut / spec.INDEX_NAME).exists() and (cut / spec.STATE_NAME).exists()
    from packer.tools.info import describe, render
    shown = render(describe(cut))  # pack-dataset info: how far the write got, how to finish it
    assert "samples given to the Writer done at the last checkpoint" in shown and " of 0 " not in shown, shown
    assert f"packer.Writer({str(cut.resolve())!r}, format={fmt!r}, ..., resume=True)" in shown, shown
    with Writer(cut, format=fmt, options=opts(fmt), classes=["a", "b", "c", "d"], resume=True) as w:
        assert 0 < w.count <= kill  # what the last checkpoint vouches for
        resumed_at = w.count
        for s in list(samples(n))[w.count:]:
            w.write(s)
    assert w.result is not None and w.result.resumed_from == resumed_at
    assert tree(cut) == tree(whole)
    with Writer(cut, format=fmt, options=opts(fmt), resume=True) as again:  # complete: nothing to do
        assert again.count == n


def test_resume_refuses_other_fields_and_lmdb(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyError):
        with Writer(out, format="hdf5", options=opts("hdf5")) as w:
            for s in samples(20):
                w.write(s)
            raise KeyError("stop")
    with pytest.raises(PackError, match=r"interrupted write had fields image:image, label:int32, caption:text"):
        Writer(out, format="hdf5", options=opts("hdf5"), resume=True, fields={"image": "image", "caption": "text"})
    with pytest.raises(UsageError, match=r"^Writer\(resume=True\) is not offered for lmdb: ") as info:
        Writer(tmp_path / "lmdb", format="lmdb", resume=True)
    assert "\n" not in str(info.value)


def test_the_writers_lmdb_transactions_commit_at_their_own_size(tmp_path, monkeypatch):
    """``packer.Writer`` writes LMDB with ``StreamLmdbWriter`` (smaller transactions than a pack's, see its
    docstring): its commits between checkpoints come at its own ``txn_bytes``, and the samples read back."""
    from packer.formats import lmdb as lmdb_writer

    assert lmdb_writer.StreamLmdbWriter.txn_bytes < lmdb_writer.LmdbWriter.txn_bytes == lmdb_writer.TXN_BYTES
    commits = []
    real_commit = lmdb_writer.LmdbWriter._commit
    monkeypatch.setattr(lmdb_writer.StreamLmdbWriter, "txn_bytes", 8 << 10)
    monkeypatch.setattr(lmdb_writer.LmdbWriter, "_commit", lambda self, *a: (
        commits.append((type(self).__name__, self._txn_bytes)), real_commit(self, *a))[1])
    with Writer(tmp_path / "out", format="lmdb", options=PackOptions(format="lmdb")) as w:
        for s in samples(40):
            w.write(s)
    between = [n for name, n in commits if n >= 8 << 10]
    assert {name for name, _ in commits} == {"StreamLmdbWriter"} and len(between) >= 3, commits
    assert [row[1] for row in read_back(tmp_path / "out")] == [sample(i)["label"] for i in range(40)]


def test_the_docs_recipe_runs(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "writing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "docs/writing.md", "exec"), {"__name__": "recipe"})
    assert verify(tmp_path / "generated-lmdb").ok


def test_labels_classes_and_stated_fields(tmp_path):
    with Writer(tmp_path / "named", format="wds", classes=["a", "b"]) as w:
        w.write(sample(0))
        with pytest.raises(SampleError, match=r"^sample 1: field 'label': 3 is not a class index \(0 \.\. 1"):
            w.write(dict(sample(1), label=3))
        w.write(dict(sample(1), label=1))
    stated = tmp_path / "stated"
    with Writer(stated, format="mmap", fields="image:image,label:int32,caption:text,boxes:float32[*,4],score:float32,"
                                              "emb:float32[3]") as w:
        for i in range(6):
            w.write(dict(sample(i), label=2 * i, emb=[i, i + 1, i + 2], __key__=f"k{i}"))
    meta = json.loads((stated / spec.INDEX_NAME).read_text())
    assert meta["classes"] == [str(i) for i in range(11)]  # without classes=: "0" .. the largest label
    assert [f["type"] for f in meta["fields"]][-2:] == ["float32", "float32[3]"]
    assert [json.loads(line) for line in (stated / spec.NAMES_FILE).read_text().splitlines()] == [
        f"k{i}" for i in range(6)]
    ds = open_dataset(stated, fields=("label", "emb"))
    assert [int(ds[i][0]) for i in range(6)] == [0, 2, 4, 6, 8, 10]
    assert np.array_equal(ds[5][1], np.array([5, 6, 7], np.float32))
    assert verify(stated).ok
