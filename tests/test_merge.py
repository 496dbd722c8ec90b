"""``packer.tools.merge.merge`` (issue 34 item 4): packs made separately joined into one dataset, no re-encoding.

The oracle is one pack of both sources made in one go (a JSONL manifest of A's rows then B's): the merged
dataset must hold the same samples in the same order, compared from the data files directly (image bytes,
or pixels for mmap; labels.npy; names.jsonl; typed fields read by ``test_fields_pack.stored_fields``, without
``readers``). Class-name differences, schema and format mismatches and a damaged source are checked on
small image folders.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import make_image_folder
from packer import OutputError, OutputExistsError, PackError, PackOptions, UsageError, pack
from packer.tools.merge import merge, merge_format
from packer.tools.verify import verify
from readers.contract import spec
from test_fields_pack import _same, stored_fields
from test_fields_read import stored_images

FORMATS = spec.FORMATS


def opts(fmt: str, **kw) -> PackOptions:
    """Small packs: one worker, the source order, wds in shards of 3, mmap resized to 24."""
    extra = {"shard_count": 3} if fmt == "wds" else {"resize": 24} if fmt == "mmap" else {}
    return PackOptions(format=fmt, workers=1, order="source", **{**extra, **kw})


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A folder of 10 generated images and one manifest row each (label 0..2, a caption)."""
    work = tmp_path_factory.mktemp("merge-rows")
    images = make_image_folder(work / "imgs", classes=2, per_class=5, size=(40, 32), seed=7)
    files = sorted(p for p in images.rglob("*") if p.suffix in (".JPEG", ".png"))
    out = [{"image": p.relative_to(work).as_posix(), "label": i % 3 if i >= 4 else i % 2,
            "caption": f"picture {i} \u2713" * (i % 3)} for i, p in enumerate(files)]
    return work, out


def _manifest(work: Path, name: str, rows: list[dict]) -> Path:
    path = work / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def packs(rows, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """format -> {"a": rows 0-3, "b": rows 4-9, "ab": rows 0-9 packed in one go}."""
    work, all_rows = rows
    manifests = {"a": _manifest(work, "a", all_rows[:4]), "b": _manifest(work, "b", all_rows[4:]),
                 "ab": _manifest(work, "ab", all_rows)}
    root = tmp_path_factory.mktemp("merge-packs")
    out: dict[str, dict[str, Path]] = {}
    for fmt in FORMATS:
        out[fmt] = {}
        for name, manifest in manifests.items():
            out[fmt][name] = root / fmt / name
            pack(manifest, out[fmt][name], opts(fmt, fields="label:int32,caption:text"))
    return out


def _names(root: Path) -> list[str]:
    return list(spec.read_index(root).names())


@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_equals_one_pack_of_both(rows, packs, tmp_path, fmt):
    a, b, ab = packs[fmt]["a"], packs[fmt]["b"], packs[fmt]["ab"]
    merged = tmp_path / "merged"
    results = merge([a, b], merged, opts(fmt))
    assert [r.images for r in results] == [10]
    want, got = spec.read_index(ab), spec.read_index(merged)
    assert got.format == fmt and got.num_samples == 10 and got.classes == want.classes == ["0", "1", "2"]
    assert got.labels.tolist() == want.labels.tolist()
    assert got.arrays["checksums"].tolist() == want.arrays["checksums"].tolist()
    assert _names(merged) == _names(ab) == _names(a) + _names(b)
    assert stored_images(merged) == stored_images(ab)  # the encoded bytes (mmap: the pixels), unchanged
    (meta_m, fields_m), (meta_ab, fields_ab) = stored_fields(merged), stored_fields(ab)
    assert meta_m["fields"] == meta_ab["fields"] and len(fields_m) == 10
    for i, (m, w) in enumerate(zip(fields_m, fields_ab)):
        assert m.keys() == w.keys() and all(_same(m[k], w[k]) for k in w), (i, m, w)
    assert [f["caption"] for f in fields_m] == [r["caption"] for r in rows[1]] and fields_m[3]["caption"] == ""
    assert np.array_equal(np.load(merged / "field_checksums.npy"), np.load(ab / "field_checksums.npy"))
    assert meta_m["stats"]["reencoded"] == 0 and meta_m["source"]["kind"] == "merged"
    assert [d["root"] for d in meta_m["source"]["datasets"]] == [str(a.resolve()), str(b.resolve())]
    report = verify(merged)
    assert report.ok and report.samples == 10, report.problems


def test_merge_format_defaults_to_the_sources(packs, tmp_path):
    a, b = packs["lmdb"]["a"], packs["lmdb"]["b"]
    assert merge_format([a, b]) == "lmdb"
    merge([a, b], tmp_path / "m")  # no options: the sources' format
    assert spec.read_index(tmp_path / "m").format == "lmdb"
    with pytest.raises(OutputExistsError):
        merge([a, b], tmp_path / "m")
    merge([a, b], tmp_path / "m", PackOptions(format="lmdb", overwrite=True))
    r = merge([a, b], tmp_path / "m", PackOptions(format="lmdb", resume=True))
    assert r[0].already_complete


def _one_line(exc: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_a_schema_mismatch_is_one_line_naming_source_and_field(rows, packs, tmp_path):
    work, all_rows = rows
    other = [{**r, "caption": [r["caption"]]} for r in all_rows[4:]]  # a JSON list: field type json
    odd = tmp_path / "odd"
    pack(_manifest(work, "odd", other), odd, opts("lmdb", fields="label:int32,caption:json"))
    with pytest.raises(UsageError) as exc:
        merge([packs["lmdb"]["a"], odd], tmp_path / "m1", opts("lmdb"))
    _one_line(exc, str(odd), "'caption'", "json", "text")
    fewer = tmp_path / "fewer"
    pack(_manifest(work, "fewer", [{"image": r["image"], "label": r["label"]} for r in all_rows[4:]]), fewer,
         opts("lmdb", fields="label:int32"))
    with pytest.raises(UsageError) as exc:
        merge([packs["lmdb"]["a"], fewer], tmp_path / "m2", opts("lmdb"))
    _one_line(exc, str(fewer), "'caption'", "missing")
    with pytest.raises(UsageError) as exc:
        merge([packs["lmdb"]["a"], packs["hdf5"]["b"]], tmp_path / "m3", opts("lmdb"))
    _one_line(exc, str(packs["hdf5"]["b"]), "hdf5")
    with pytest.raises(UsageError) as exc:
        merge([packs["lmdb"]["a"], packs["lmdb"]["a"]], tmp_path / "m4", opts("lmdb"))
    _one_line(exc, "given twice")
    with pytest.raises(OutputError) as exc:
        merge([packs["lmdb"]["a"], packs["lmdb"]["b"]], packs["lmdb"]["b"] / "inside", opts("lmdb"))
    _one_line(exc, "overlaps the source dataset", str(packs["lmdb"]["b"]))
    assert not (packs["lmdb"]["b"] / "inside").exists()
    assert not any((tmp_path / f"m{k}").exists() for k in range(1, 5))


def _folder(root: Path, classes: list[str], seed: int) -> Path:
    make_image_folder(root, classes=len(classes), per_class=3, size=(30, 26), seed=seed)
    for k, name in enumerate(classes):
        (root / f"class_{k:02d}").rename(root / name)
    return root


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_class_names_are_merged_and_labels_remapped(tmp_path, fmt, stored_bytes):
    a, b = tmp_path / "pa", tmp_path / "pb"
    pack(_folder(tmp_path / "a", ["cat", "dog"], 1), a, opts(fmt))
    pack(_folder(tmp_path / "b", ["bird", "dog", "emu"], 2), b, opts(fmt))
    merged = tmp_path / "m"
    merge([a, b], merged, opts(fmt))
    index = spec.read_index(merged)
    assert index.classes == ["cat", "dog", "bird", "emu"]  # the first's, then the new names in order
    names = _names(merged)
    assert [index.classes[label] for label in index.labels.tolist()] == [n.split("/")[0] for n in names]
    na = spec.read_index(a).num_samples
    assert index.labels.tolist()[na:] == [{0: 2, 1: 1, 2: 3}[x] for x in spec.read_index(b).labels.tolist()]
    assert json.loads((merged / spec.INDEX_NAME).read_text())["class_counts"] == [3, 6, 3, 3]
    assert [stored_bytes(merged, i) for i in range(index.num_samples)] == \
        [stored_bytes(a, i) for i in range(na)] + [stored_bytes(b, i) for i in range(index.num_samples - na)]
    assert verify(merged).ok


def test_a_flipped_byte_in_a_source_is_refused_naming_the_sample(packs, tmp_path):
    a = Path(shutil.copytree(packs["wds"]["b"], tmp_path / "damaged"))
    index = spec.read_index(a)
    victim = 4
    shard = a / index.meta["shards"][int(index.arrays["shards"][victim])]["name"]
    blob = bytearray(shard.read_bytes())
    blob[int(index.arrays["offsets"][victim]) + 30] ^= 0xFF
    shard.write_bytes(bytes(blob))
    out = tmp_path / "m"
    with pytest.raises(PackError) as exc:
        merge([packs["wds"]["a"], a], out, opts("wds"))
    _one_line(exc, f"{a} sample {victim}: checksum mismatch", "pack-dataset verify")
    assert not (out / spec.INDEX_NAME).exists() and (out / spec.STATE_NAME).exists()  # resumable


def test_a_flipped_byte_in_a_field_is_refused_naming_sample_and_field(packs, tmp_path):
    a = Path(shutil.copytree(packs["mmap"]["b"], tmp_path / "damaged"))
    offsets = np.load(a / "field-caption.offsets.npy")
    victim = next(i for i in range(len(offsets) - 1) if offsets[i + 1] > offsets[i])
    blob = bytearray((a / "field-caption.bin").read_bytes())
    blob[int(offsets[victim])] ^= 0x01
    (a / "field-caption.bin").write_bytes(bytes(blob))
    with pytest.raises(PackError) as exc:
        merge([packs["mmap"]["a"], a], tmp_path / "m", opts("mmap"))
    _one_line(exc, f"sample {victim} field 'caption': checksum mismatch", str(a))


def test_splits_are_merged_split_by_split(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        make_image_folder(tmp_path / name / "train", classes=2, per_class=2, seed=seed)
        make_image_folder(tmp_path / name / "val", classes=2, per_class=1, seed=seed + 10)
        pack(tmp_path / name, tmp_path / f"p{name}", opts("hdf5"))
    results = merge([tmp_path / "pa", tmp_path / "pb"], tmp_path / "m", opts("hdf5"))
    assert sorted((r.split, r.images) for r in results) == [("train", 8), ("val", 4)]
    for split in ("train", "val"):
        assert _names(tmp_path / "m" / split) == _names(tmp_path / "pa" / split) + _names(tmp_path / "pb" / split)
    shutil.rmtree(tmp_path / "pb" / "val")
    with pytest.raises(UsageError) as exc:
        merge([tmp_path / "pa", tmp_path / "pb"], tmp_path / "m2", opts("hdf5"))
    _one_line(exc, str(tmp_path / "pb"), "splits")


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_an_interrupted_merge_resumes_to_the_same_output(packs, tmp_path, monkeypatch, fmt):
    """Stopped inside the second source (sample 6 of 10), ``resume=True`` carries on from the journal: the
    same samples, labels, checksums, names and fields as a merge that ran through."""
    import errno

    import packer.tools.convert as conv

    srcs = [packs[fmt]["a"], packs[fmt]["b"]]
    reference = tmp_path / "reference"
    merge(srcs, reference, opts(fmt, checkpoint_bytes=1))
    real_stage = conv.prepare_stage

    def failing_stage(indexes):
        stage = real_stage(indexes)

        def run_stage(source, start, image_opts, workers):
            for k, outcome in enumerate(stage(source, start, image_opts, workers)):
                if k == 6:
                    raise OSError(errno.EIO, "simulated")
                yield outcome

        return run_stage

    out = tmp_path / "out"
    monkeypatch.setattr(conv, "prepare_stage", failing_stage)
    with pytest.raises(PackError, match="--resume"):
        merge(srcs, out, opts(fmt, checkpoint_bytes=1))
    monkeypatch.undo()
    assert not (out / spec.INDEX_NAME).exists()
    state = json.loads((out / spec.STATE_NAME).read_text())
    assert state["next_source"] == 6 and state["source"]["kind"] == "merged"
    from packer.cli import main as cli_main
    from packer.tools.info import describe

    command = describe(out)["resume"]  # what `pack-dataset info OUT` tells the user to run
    words = shlex.split(command)
    assert words[:2] == ["pack-dataset", "merge"] and words[2:4] == [str(s) for s in srcs], command
    assert words[words.index("-o") + 1] == str(out) and words[-1] == "--resume", command
    assert cli_main(words[1:] + ["-q"]) == 0
    want, got = spec.read_index(reference), spec.read_index(out)
    for name in ("labels", "checksums", "sizes"):
        assert got.arrays[name].tolist() == want.arrays[name].tolist(), name
    assert _names(out) == _names(reference) and stored_images(out) == stored_images(reference)
    assert stored_fields(out)[1] == stored_fields(reference)[1]
    assert verify(out).ok


def test_the_cli_merges_and_says_what_it_wrote(packs, tmp_path, capsys):
    """``pack-dataset merge A B -o OUT``: exit 0, the pack's summary line, a dataset equal to the API's merge;
    a folder that is not a dataset is exit 2 in one line naming it, nothing written."""
    from packer.cli import main as cli_main

    a, b = packs["lmdb"]["a"], packs["lmdb"]["b"]
    assert cli_main(["merge", str(a), str(b), "-o", str(tmp_path / "cli"), "-q", "-w", "1"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith(f"-> {tmp_path / 'cli'}") and "10 samples" in out, out
    merge([a, b], tmp_path / "api", opts("lmdb"))
    cli, api = spec.read_index(tmp_path / "cli"), spec.read_index(tmp_path / "api")
    assert cli.meta["classes"] == api.meta["classes"]
    for name in ("labels", "checksums", "sizes"):
        assert cli.arrays[name].tolist() == api.arrays[name].tolist(), name
    assert _names(tmp_path / "cli") == _names(tmp_path / "api")
    assert stored_images(tmp_path / "cli") == stored_images(tmp_path / "api")
    assert verify(tmp_path / "cli").ok
    (tmp_path / "junk").mkdir()
    assert cli_main(["merge", str(a), str(tmp_path / "junk"), "-o", str(tmp_path / "bad"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path / "junk") in err and not (tmp_path / "bad").exists(), err
