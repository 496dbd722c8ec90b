"""Append (issue 34 item 3): ``Writer(out, append=True)``, ``pack_map(..., append=True)`` and
``pack-dataset SRC --append OUT`` add samples to a finished dataset of each format as its next
generation. Three appends read back exactly, generation by generation; a reader opened before an
append (and a loader's saved state) reads the generation it opened; verify covers the appended data;
an append killed with SIGKILL leaves the previous generation intact and resumes (or rolls back)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import make_image_folder
from packer import PackError, UsageError, Writer, pack_map, roll_back
from packer.cli import main as cli_main
from packer.tools.verify import verify
from readers import make_loader, open_dataset
from readers.contract import spec
from readers.contract.generations import generation_of, history

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("wds", "lmdb", "hdf5", "mmap")
SIZES = (20, 9, 14, 7)  # generation 0, then three appends


# The samples, as code a child process runs too (it imports packer only: no torch, no test modules).
SAMPLES = """
import io
import numpy as np
from PIL import Image
from packer import PackOptions, Writer


def image(i):
    # a small PNG, distinct per i (8 to 12 pixels wide: mmap keeps each one's shape)
    arr = np.random.default_rng(i).integers(0, 256, (8, 8 + i % 5, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def sample(i):
    return {"image": image(i), "label": i % 3 if i < 20 else i % 4}  # class 3 comes with the first append


def opts(fmt, **kw):
    return PackOptions(format=fmt, shard_count=6, checkpoint_bytes=2048, **kw)


def write(out, fmt, start, stop, **kw):
    with Writer(out, format=fmt, options=opts(fmt), **kw) as w:
        for i in range(start, stop):
            w.write(sample(i))
    return w
"""
exec(SAMPLES)  # image, sample, opts, write

APPEND = SAMPLES + """
import sys
write(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), append=True)
"""


def append_elsewhere(out: Path, fmt: str, start: int, stop: int) -> None:
    """An append by another process (as a weekly job is; LMDB opens an environment once per process)."""
    proc = subprocess.run([sys.executable, "-c", APPEND, str(out), fmt, str(start), str(stop)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr


def opened(out: Path, **kw):
    fmt = spec.read_meta(out)["format"]
    return open_dataset(out, decode=False, **({"shuffle": False, "pad": False} if fmt == "wds" else {}), **kw)


def rows(ds) -> list[tuple[bytes, int]]:
    """(stored bytes or pixels, label) of every sample, in order."""
    if ds.format == "wds":
        return [(bytes(x), int(y)) for x, y in ds]
    return [(np.asarray(ds[i][0]).tobytes(), int(ds[i][1])) for i in range(len(ds))]


def bounds() -> list[int]:
    return [sum(SIZES[:k + 1]) for k in range(len(SIZES))]


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> dict[str, tuple[Path, list]]:
    """Each format: a dataset written in one go (the reference) and the same samples as generation 0
    plus three appends, with the rows a reader opened at generation 0 read after all of them."""
    root = tmp_path_factory.mktemp("grown")
    out = {}
    for fmt in FORMATS:
        whole, grown = root / fmt / "whole", root / fmt / "grown"
        write(whole, fmt, 0, bounds()[-1])
        write(grown, fmt, 0, SIZES[0])
        early = opened(grown)  # opened before any append, read only after them
        for k in range(1, len(SIZES)):
            append_elsewhere(grown, fmt, bounds()[k - 1], bounds()[k]) if fmt == "lmdb" else \
                write(grown, fmt, bounds()[k - 1], bounds()[k], append=True)
        out[fmt] = (whole, grown, rows(early))
    return out


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_three_appends_read_back_generation_by_generation(grown, fmt):
    whole, out, _ = grown[fmt]
    reference = rows(opened(whole))
    meta = spec.read_meta(out)
    assert generation_of(meta) == 3 and meta["num_samples"] == bounds()[-1]
    assert [(g["generation"], g["num_samples"], g["added"]) for g in history(meta)] == \
        [(k, bounds()[k], SIZES[k]) for k in range(4)]
    assert meta["classes"] == ["0", "1", "2", "3"]  # the new class at the end
    for g in range(4):
        ds = opened(out, generation=g)
        assert rows(ds) == reference[:bounds()[g]], f"generation {g}"
        assert ds.classes == (["0", "1", "2"] if g == 0 else ["0", "1", "2", "3"])
    assert rows(opened(out)) == reference
    report = verify(out)
    assert report.ok and report.samples == bounds()[-1], report


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_a_reader_opened_before_the_appends_reads_its_generation(grown, fmt):
    whole, _, early = grown[fmt]
    assert early == rows(opened(whole))[:SIZES[0]]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_a_reader_and_a_loader_state_from_before_an_append_by_another_process(tmp_path, fmt):
    out = tmp_path / "out"
    write(out, fmt, 0, 23)
    reader = opened(out)
    first = rows(reader)[:5] if fmt == "wds" else [rows(reader)[i] for i in range(5)]

    def loader(generation=None):
        ds = open_dataset(out, decode=False, return_index=True, generation=generation)
        return make_loader(ds, batch_size=4, num_workers=0, seed=5)

    whole = [b[2].tolist() for b in loader()]
    job = loader()
    got = []
    for b in job:
        got.append(b[2].tolist())
        if len(got) == 3:
            break
    saved = {"loader": job.state_dict(), "generation": generation_of(job.dataset.index.meta)}
    del job
    append_elsewhere(out, fmt, 23, 40)
    resumed = loader(saved["generation"])
    resumed.load_state_dict(json.loads(json.dumps(saved["loader"])))
    assert got + [b[2].tolist() for b in resumed] == whole
    assert sum(len(b[2]) for b in loader()) == 40  # reopened: the new generation
    assert rows(reader)[:5] == first and len(rows(reader)) == 23  # the reader opened before: its generation
    spawned = pickle.loads(pickle.dumps(reader))  # what a spawned worker gets: its generation's files again
    assert rows(spawned) == rows(reader)


def test_verify_finds_a_flipped_byte_in_an_appended_shard(grown, tmp_path):
    import shutil

    out = tmp_path / "wds"
    shutil.copytree(grown["wds"][1], out)
    meta = spec.read_meta(out)
    shard = meta["shards"][-1]["name"]  # written by the last append
    raw = bytearray((out / shard).read_bytes())
    raw[spec.TAR_BLOCK + 3] ^= 0xFF  # inside the first sample's image
    (out / shard).write_bytes(bytes(raw))
    report = verify(out)
    assert not report.ok
    assert any(shard in str(p) for p in report.problems), report.problems


KILLED = SAMPLES + """
import os, sys
from reliability_helpers import kill_once_checkpointed
w = Writer(sys.argv[1], format=sys.argv[2], options=opts(sys.argv[2]), append=True)
for i in range(20, 170):
    if i == int(sys.argv[3]):
        kill_once_checkpointed(os.path.join(sys.argv[1], sys.argv[4]), above=20)  # done counts generation 0
    w.write(sample(i))
"""


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_an_append_killed_with_sigkill_leaves_the_generation_and_resumes(tmp_path, fmt):
    whole, out = tmp_path / "whole", tmp_path / "out"
    # killed after sample 160 was given, once a checkpoint of the append (a shard of 6, or 2 KB) is durable
    write(whole, fmt, 0, 170)
    write(out, fmt, 0, 20)
    before = rows(opened(out))
    proc = subprocess.run([sys.executable, "-c", KILLED, str(out), fmt, "160", spec.STATE_NAME],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")])))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (out / spec.STATE_NAME).exists()
    assert rows(opened(out)) == before and verify(out).ok  # generation 0, intact
    from packer.tools.info import describe, render
    shown = render(describe(out))  # pack-dataset info: the generation as it is, the append and how to finish it
    assert "  samples      20\n" in shown and "append       interrupted: " in shown, shown
    assert f"packer.Writer({str(out.resolve())!r}, format={fmt!r}, ..., append=True, resume=True)" in shown, shown
    with pytest.raises(PackError, match=r"an append to generation 0 was interrupted; finish it with resume=True"):
        Writer(out, format=fmt, options=opts(fmt), append=True)
    if fmt != "lmdb":  # (a plain resume of lmdb is refused before this)
        with pytest.raises(PackError, match=r"the interrupted work is an append to generation 0: finish it with"):
            Writer(out, format=fmt, options=opts(fmt), resume=True)
    with Writer(out, format=fmt, options=opts(fmt), append=True, resume=True) as w:
        assert 0 < w.count <= 140  # what the last checkpoint vouches for
        for i in range(20 + w.count, 170):
            w.write(sample(i))
    assert rows(opened(out)) == rows(opened(whole))
    assert generation_of(spec.read_meta(out)) == 1 and not (out / spec.STATE_NAME).exists()
    assert verify(out).ok


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_an_interrupted_append_rolls_back(tmp_path, fmt):
    out = tmp_path / "out"
    write(out, fmt, 0, 20)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.name not in ("lock.mdb",)}
    with pytest.raises(KeyError):
        with Writer(out, format=fmt, options=opts(fmt), append=True) as w:
            for i in range(20, 70):
                w.write(sample(i))
            raise KeyError("the producer failed")
    assert roll_back(out) == 0
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name not in ("lock.mdb",)}
    assert set(after) == set(files)
    if fmt != "lmdb":  # LMDB's data.mdb keeps its own page history; its samples are checked below
        assert {k: v for k, v in after.items() if k in files} == files
    assert len(rows(opened(out))) == 20 and verify(out).ok
    write(out, fmt, 20, 30, append=True)  # and the next append goes on from there
    assert len(rows(opened(out))) == 30


def test_schema_and_classes_must_agree(tmp_path):
    out = tmp_path / "out"
    with Writer(out, format="hdf5", classes=["cat", "dog"]) as w:
        w.write({"image": image(0), "label": 1})
    with pytest.raises(UsageError, match=r"field 'caption' is not a field there, text in the samples"):
        with Writer(out, format="hdf5", append=True) as w:
            w.write({"image": image(1), "label": 0, "caption": "a new field"})
    with pytest.raises(UsageError, match=r"its classes are \['cat', 'dog'\]; the classes given must start with them"):
        Writer(out, format="hdf5", append=True, classes=["dog", "cat"])
    with pytest.raises(UsageError, match=r"is a hdf5 dataset; append to it with format 'hdf5' \(not 'wds'\)"):
        Writer(out, format="wds", append=True)
    with Writer(out, format="hdf5", append=True, classes=["cat", "dog", "bird"]) as w:
        w.write({"image": image(2), "label": 2})
    ds = opened(out)
    assert ds.classes == ["cat", "dog", "bird"] and [int(ds[i][1]) for i in range(2)] == [1, 2]
    with pytest.raises(PackError, match=r"no interrupted append to resume \(generation 1 is complete\)"):
        Writer(out, format="hdf5", append=True, resume=True)


def test_pack_map_appends(tmp_path):
    out = tmp_path / "out"
    pack_map(sample, range(10), out, format="wds", workers=0, options=opts("wds"), append=True)  # nothing yet
    assert spec.read_meta(out)["num_samples"] == 10 and generation_of(spec.read_meta(out)) == 0
    result = pack_map(sample, range(10, 25), out, format="wds", workers=2, options=opts("wds"), append=True)
    assert result.samples == 15
    assert [y for _, y in rows(opened(out))] == [sample(i)["label"] for i in range(25)]
    assert generation_of(spec.read_meta(out)) == 1


def test_cli_append_and_resume(tmp_path, capsys):
    first = make_image_folder(tmp_path / "week1", classes=2, per_class=4, size=(24, 20), seed=1)
    second = make_image_folder(tmp_path / "week2", classes=3, per_class=3, size=(24, 20), seed=2)
    out = tmp_path / "ds"
    assert cli_main(["pack", str(first), "-f", "lmdb", "-o", str(out), "-q"]) == 0
    assert cli_main(["pack", str(second), "--append", str(out), "-q"]) == 0  # -f: the dataset's
    assert "17 samples, 3 classes" in capsys.readouterr().out.splitlines()[-1]
    meta = spec.read_meta(out)
    assert meta["num_samples"] == 17 and generation_of(meta) == 1
    assert meta["classes"] == ["class_00", "class_01", "class_02"]
    names = list(spec.read_index(out).names())
    images = [p for p in second.rglob("*.*") if p.suffix.lower() in (".jpeg", ".jpg", ".png")]
    assert names[8:] == sorted(p.relative_to(second).as_posix() for p in images)
    labels = spec.read_index(out).labels
    assert labels[8:].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert cli_main(["pack", str(second), "--append", str(out), "--resume", "-q"]) == 1
    assert "no interrupted append to resume (generation 1 is complete)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli_main(["pack", str(second), "--append", str(out), "-o", str(out)])
    assert exit_.value.code == 2 and "--append OUT names the output" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli_main(["pack", str(second), "--append", str(tmp_path / "none")])
    assert exit_.value.code == 2 and "holds no dataset yet: give -f/--format" in capsys.readouterr().err
    assert cli_main(["pack", str(second), "--append", str(tmp_path / "none"), "-f", "mmap", "-q"]) == 0
    assert spec.read_meta(tmp_path / "none")["num_samples"] == 9  # the first generation
    with pytest.raises(SystemExit) as exit_:
        cli_main(["pack", str(second), "--append", "s3://bucket/ds"])
    assert exit_.value.code == 2 and "appending to a dataset on object storage is not supported yet" in \
        capsys.readouterr().err


PACK_KILLED = """
import os, signal, sys
sys.path[:0] = [{root!r}]
from packer import PackOptions, pack
done = [0]
def progress(split, source):
    def tick(images, nbytes):
        done[0] += images
        if done[0] == {kill}:
            os.kill(os.getpid(), signal.SIGKILL)
    return tick
pack({src!r}, {out!r}, PackOptions(format="hdf5", workers=1, checkpoint_bytes=2048, append=True), progress=progress)
"""


def test_cli_append_killed_then_resumed(tmp_path, capsys):
    first = make_image_folder(tmp_path / "week1", classes=2, per_class=4, size=(24, 20), seed=1)
    second = make_image_folder(tmp_path / "week2", classes=2, per_class=10, size=(24, 20), seed=2)
    out, whole = tmp_path / "ds", tmp_path / "whole"
    for dest in (out, whole):
        assert cli_main(["pack", str(first), "-f", "hdf5", "-o", str(dest), "-q"]) == 0
    assert cli_main(["pack", str(second), "--append", str(whole), "-q", "--checkpoint-bytes", "2KB"]) == 0
    before = rows(opened(out))
    code = PACK_KILLED.format(root=str(ROOT), src=str(second), out=str(out), kill=15)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert rows(opened(out)) == before  # generation 0 still reads, unchanged
    from packer.tools.info import describe, render
    shown = render(describe(out))
    assert f"--append {out.resolve()}" in shown and "--resume" in shown, shown
    assert cli_main(["pack", str(second), "--append", str(out), "-q", "--checkpoint-bytes", "2KB"]) == 1
    assert "an append to generation 0 was interrupted; finish it with resume=True (--resume)" in \
        capsys.readouterr().err
    assert cli_main(["pack", str(second), "--append", str(out), "--resume", "-q", "--checkpoint-bytes", "2KB"]) == 0
    assert rows(opened(out)) == rows(opened(whole)) and verify(out).ok
    shown = render(describe(out))
    assert "  generations  2: 0: 8, 1: 28 (+20 on " in shown, shown


def typed(i: int) -> dict:
    """A sample with typed fields: a caption, boxes (variable rows), a float and a fixed embedding."""
    return {"image": image(i), "label": i % 3, "caption": f"picture {i}" * (1 + i % 3),
            "boxes": np.arange(4 * (i % 3), dtype=np.float32).reshape(-1, 4) + i, "score": i / 7,
            "emb": np.full(3, i, dtype=np.float32)}


TYPED = {"image": "image", "label": "int32", "caption": "text", "boxes": "float32[*,4]", "score": "float",
         "emb": "float32[3]"}


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "mmap"])
def test_appends_with_typed_fields_read_back_and_keep_their_stats(tmp_path, fmt):
    fields = TYPED if fmt != "mmap" else {k: v for k, v in TYPED.items() if k not in ("caption", "boxes")}
    names = tuple(fields)

    def put(out, start, stop, **kw):
        with Writer(out, format=fmt, options=opts(fmt), fields=fields if not kw else None, **kw) as w:
            for i in range(start, stop):
                w.write({k: v for k, v in typed(i).items() if k in fields})

    whole, out = tmp_path / "whole", tmp_path / "out"
    put(whole, 0, 40)
    put(out, 0, 16)
    early = opened(out, fields=names)
    early_rows = [repr(x) for x in (early if fmt == "wds" else [early[i] for i in range(16)])]
    if fmt == "lmdb":
        early.close()  # one LMDB environment per process: the Writer's (it opens again when read)
    put(out, 16, 30, append=True)
    put(out, 30, 40, append=True)

    def items(ds, n):
        return [repr(x) for x in (ds if fmt == "wds" else [ds[i] for i in range(n)])]
    assert items(opened(out, fields=names), 40) == items(opened(whole, fields=names), 40)
    assert items(early, 16) == early_rows  # a reader of generation 0, its columns opened after the appends
    assert items(opened(out, fields=names, generation=1), 30) == items(opened(whole, fields=names), 40)[:30]
    assert spec.read_meta(out)["field_stats"] == spec.read_meta(whole)["field_stats"]
    assert verify(out).ok


def test_fields_an_append_cannot_grow_are_refused_in_one_line(tmp_path):
    with Writer(tmp_path / "h5", format="hdf5", fields=TYPED) as w:
        w.write(typed(0))
    with pytest.raises(UsageError, match=r"appending to a hdf5 dataset with field\(s\) caption, boxes, score, emb "
                                         r"is not supported yet"):
        Writer(tmp_path / "h5", format="hdf5", append=True)
    with Writer(tmp_path / "mm", format="mmap", fields=TYPED) as w:
        w.write(typed(0))
    with pytest.raises(UsageError, match=r"appending to a mmap dataset with field\(s\) caption, boxes is not"):
        Writer(tmp_path / "mm", format="mmap", append=True)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_an_interrupted_append_with_typed_fields_resumes_to_a_whole_write(tmp_path, fmt):
    whole, out = tmp_path / "whole", tmp_path / "out"
    for dest, stop in ((whole, 150), (out, 20)):
        with Writer(dest, format=fmt, options=opts(fmt), fields=TYPED) as w:
            for i in range(stop):
                w.write(typed(i))
    with pytest.raises(KeyError):
        with Writer(out, format=fmt, options=opts(fmt), append=True) as w:
            for i in range(20, 150):
                w.write(typed(i))
                if i == 140:
                    raise KeyError("the producer failed")
    with Writer(out, format=fmt, options=opts(fmt), append=True, resume=True) as w:
        assert 0 < w.count <= 121
        for i in range(20 + w.count, 150):
            w.write(typed(i))
    names = tuple(TYPED)
    ours, theirs = opened(out, fields=names), opened(whole, fields=names)
    assert [repr(x) for x in (ours if fmt == "wds" else [ours[i] for i in range(150)])] == \
        [repr(x) for x in (theirs if fmt == "wds" else [theirs[i] for i in range(150)])]
    assert spec.read_meta(out)["field_stats"] == spec.read_meta(whole)["field_stats"] and verify(out).ok
