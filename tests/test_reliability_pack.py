"""Packing under abuse (issue 10, items 2, 4, 5, 6, 7, 8, 12 and the command line's messages).

The real ``pack-dataset`` runs in child processes: two at once, killed at
chosen moments (``os._exit`` when a function is first called, like ``kill
-9`` there), stopped with SIGTERM, or started on hostile sources. Each test
checks the exit code, that stderr holds one line naming the file and no
traceback, and that the documented next command works.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import make_image_folder
from packer import PackError, PackOptions, pack
from readers import open_dataset
from readers.contract import spec
from reliability_helpers import (
    assert_one_line, cli, content, digest, error_lines, no_root_powers, pack_killed_at, slow_pack, verify_here,
    wait_for,
)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("rel") / "train", classes=3, per_class=10, png_every=0)


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted pack of ``src`` per format (wds with 4-sample shards)."""
    root = tmp_path_factory.mktemp("ref")
    return {fmt: _pack_cli(src, root / fmt, fmt) for fmt in spec.FORMATS}


EXTRA = {"wds": ["--shard-count", "4"], "lmdb": ["--checkpoint-bytes", "20k"],
         "hdf5": ["--checkpoint-bytes", "20k"], "mmap": ["--checkpoint-bytes", "20k"]}


def _args(src, out, fmt, *more):
    return [src, "-f", fmt, "-o", out, "-q", "--workers", "1", *EXTRA[fmt], *more]


def _pack_cli(src, out, fmt, *more):
    r = cli(*_args(src, out, fmt, *more))
    assert r.returncode == 0, r.stderr
    return out


def _verified(root: Path) -> None:
    r = verify_here(root)
    assert r.returncode == 0, r.stdout + r.stderr


def _same_dataset(out: Path, ref: Path, fmt: str) -> None:
    if fmt in ("wds", "mmap"):
        assert digest(out) == digest(ref)
    else:  # container bytes may differ with the commit history; content and index arrays may not
        ref_files, out_files = digest(ref), digest(out)
        for name in ref_files:
            if name.endswith(".npy") or name == spec.NAMES_FILE:
                assert out_files[name] == ref_files[name], name
        assert content(out) == content(ref)


# ---------------------------------------------------------------- 2. one pack per folder
@pytest.mark.slow
@pytest.mark.parametrize("second", ["plain", "resume", "overwrite"])
def test_a_second_pack_into_a_busy_folder_exits_2_naming_the_holder(src, tmp_path, second):
    out = tmp_path / "out"
    first = slow_pack(*_args(src, out, "wds"), delay=0.1, hold=tmp_path / "go")
    wait_for(lambda: (out / spec.STATE_NAME).exists(), what="the first pack's journal")
    more = {"plain": [], "resume": ["--resume"], "overwrite": ["--overwrite"]}[second]
    r = cli(*_args(src, out, "wds", *more))
    assert_one_line(r, 2, str(out), f"pid {first.pid}", "another pack-dataset")
    (tmp_path / "go").touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err  # the first pack is untouched by the second
    _verified(out)
    index = spec.read_index(out)
    assert len(list(index.names())) == index.num_samples == 30
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith((".tar", ".npy"))) == sorted([
        spec.INDEX_NAME, spec.NAMES_FILE, spec.WIDS_INDEX_NAME])  # no leftover journal, no lock file


@pytest.mark.slow
def test_a_split_folder_being_packed_is_locked_too(tmp_path):
    make_image_folder(tmp_path / "src" / "train", classes=2, per_class=8, png_every=0)
    make_image_folder(tmp_path / "src" / "val", classes=2, per_class=8, png_every=0, seed=1)
    out = tmp_path / "out"
    first = slow_pack(tmp_path / "src", "-f", "lmdb", "-o", out, "-q", "--workers", "1", delay=0.1,
                      hold=tmp_path / "go")
    wait_for(lambda: (out / "train" / spec.STATE_NAME).exists(), what="the first split's journal")
    for target in (out / "train", out / "val"):  # val: locked up front, before its turn
        r = cli(tmp_path / "src" / target.name, "-f", "lmdb", "-o", target, "-q", "--overwrite")
        assert_one_line(r, 2, str(target), f"pid {first.pid}")
    (tmp_path / "go").touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    for split in ("train", "val"):
        _verified(out / split)


def test_locks_conflict_and_are_removed_on_release(tmp_path):
    from packer.output import OutputBusyError, OutputLock
    from readers.contract.locks import LOCK_NAME

    with OutputLock() as one:
        one.acquire(tmp_path / "out")
        assert (tmp_path / "out" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"):
            OutputLock().acquire(tmp_path / "out")
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    with OutputLock() as two:  # free again
        two.acquire(tmp_path / "out")


@pytest.mark.slow
def test_kill9_with_a_worker_pool_leaves_no_lock_and_no_broken_pipe_tracebacks(src, tmp_path, reference):
    out = tmp_path / "out"
    first = slow_pack(*_args(src, out, "wds")[:-4], "--shard-count", "4", "--workers", "2", delay=0.1,
                      start_new_session=True)
    wait_for(lambda: (out / spec.STATE_NAME).exists() and json.loads((out / spec.STATE_NAME).read_text())["done"] >= 4,
             what="a checkpoint")
    first.send_signal(signal.SIGKILL)
    _, err = first.communicate(timeout=60)  # returns once the workers (sharing stderr) are gone too
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert (out / ".pack-lock").exists()  # stale: nobody holds it
    r = cli(*_args(src, out, "wds", "--resume"))
    assert r.returncode == 0, r.stderr
    _same_dataset(out, reference["wds"], "wds")
    assert not (out / ".pack-lock").exists()


# ---------------------------------------------------------------- 3 (injected) / 4. a source file changing
@pytest.mark.slow
def test_a_file_overwritten_after_validation_is_not_stored(tmp_path, monkeypatch):
    """Same size, other bytes, between the worker's check and the writer's re-read (a pool of 2)."""
    import packer.prepare.workers as workers

    src = make_image_folder(tmp_path / "src", classes=2, per_class=8, png_every=0)
    victim = "class_01/img_002.JPEG"
    real = workers.prepared_outcomes

    def racing(root, paths, opts, n):
        for rel, outcome in zip(paths, real(root, paths, opts, n)):
            if rel == victim:  # the worker has checked it; now it changes in place
                data = bytearray((root / rel).read_bytes())
                data[200:500] = bytes(300)
                (root / rel).write_bytes(bytes(data))
            yield outcome

    monkeypatch.setattr(workers, "prepared_outcomes", racing)
    out = tmp_path / "out"
    opts = dict(format="lmdb", workers=2, checkpoint_bytes=4096)
    with pytest.raises(PackError, match=rf"{victim} changed while it was being packed \(same size, other bytes\);"
                                        " re-run with --resume"):
        pack(src, out, PackOptions(**opts))
    monkeypatch.undo()
    result = pack(src, out, PackOptions(**opts, resume=True))[0]  # the prefix before it is unchanged
    fresh = pack(src, tmp_path / "fresh", PackOptions(**opts))[0]
    assert (result.images, result.rejected) == (fresh.images, fresh.rejected)
    assert content(out) == content(tmp_path / "fresh")


@pytest.mark.parametrize("order", ["source", "shuffled"])
def test_a_vanished_source_file_leads_to_a_command_that_works(tmp_path, order):
    src = make_image_folder(tmp_path / "src", classes=3, per_class=6, png_every=0)
    victim = src / "class_02" / "img_001.JPEG"

    def progress(split, source):
        victim.unlink()  # gone after the scan, before it is read (the source is read ahead)
        return None

    out = tmp_path / "out"
    opts = dict(format="wds", workers=1, shard_count=3, order=order)
    with pytest.raises(PackError, match="img_001.JPEG: read error") as info:
        pack(src, out, PackOptions(**opts), progress=progress)
    assert json.loads((out / spec.STATE_NAME).read_text())["next_source"] > 0  # checkpoints before the victim
    pack(src, tmp_path / "fresh", PackOptions(**opts))
    if order == "source":
        assert "re-run with --resume (after restoring it, or without it)" in str(info.value)
        result = pack(src, out, PackOptions(**opts, resume=True))[0]  # not "the source changed"
        assert result.images == 17 and result.resumed_from > 0
    else:  # every position moves when a file goes: the message says so, and --overwrite works
        assert "restore it and re-run with --resume, or start again with --overwrite" in str(info.value)
        with pytest.raises(PackError, match="holds 17 images, 18 when the pack started, and a shuffled order .* "
                                            "restore the source and --resume, or start again with --overwrite"):
            pack(src, out, PackOptions(**opts, resume=True))
        pack(src, out, PackOptions(**opts, overwrite=True))
    assert digest(out) == digest(tmp_path / "fresh")  # exactly a fresh pack of the source as it is now


@pytest.mark.slow
def test_resume_refuses_a_change_in_the_part_already_packed(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=2, per_class=6, png_every=0)
    out = tmp_path / "out"
    r = pack_killed_at("packer.pipeline:_WriteStage._finish", src, "-f", "wds", "-o", out, "-q", "--shard-count", "3")
    assert r.returncode == 137
    with open(src / "class_00" / "img_000.JPEG", "ab") as f:
        f.write(b"\0")  # a packed file changes size
    r = cli(src, "-f", "wds", "-o", out, "-q", "--shard-count", "3", "--resume")
    assert_one_line(r, 1, str(out), "changed in the part already packed", "--overwrite")
    assert cli(src, "-f", "wds", "-o", out, "-q", "--shard-count", "3", "--overwrite").returncode == 0


# ---------------------------------------------------------------- 5. splits only by name (or by flag)
def test_nested_class_folders_are_one_dataset(tmp_path):
    """root/cat/2020/*.jpg, root/dog/2021/*.jpg: torchvision reads 2 classes; so do we."""
    src = tmp_path / "src"
    for cls, year in (("cat", "2020"), ("dog", "2021")):
        make_image_folder(src / cls / year, classes=1, per_class=3)
    results = pack(src, tmp_path / "out", PackOptions(format="wds", workers=1))
    assert len(results) == 1 and results[0].out == tmp_path / "out"
    index = spec.read_index(tmp_path / "out")
    assert index.classes == ["cat", "dog"] and sorted(index.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    assert "one dataset: sub-folders inside class folders are part of their class" in results[0].summary()


def _split_source(root: Path) -> Path:
    make_image_folder(root / "train", classes=2, per_class=2)
    make_image_folder(root / "val", classes=2, per_class=1, seed=3)
    return root


@pytest.mark.slow
def test_split_names_are_said_in_the_summary(tmp_path):
    r = cli(_split_source(tmp_path / "src"), "-f", "wds", "-o", tmp_path / "out", "-q")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["train", "val"]
    assert all("(split train of train, val)" in lines[0] and "(split val of train, val)" in lines[1] for _ in [0])


@pytest.mark.parametrize("flag, expect", [("none", {"": ["train", "val"]}), ("val", {"val": ["class_00", "class_01"]}),
                                          ("auto", {"train": ["class_00", "class_01"], "val": ["class_00", "class_01"]})])
def test_the_splits_flag_decides(tmp_path, flag, expect):
    src = _split_source(tmp_path / "src")
    results = pack(src, tmp_path / "out", PackOptions(format="hdf5", workers=1, splits=flag))
    got = {str(r.out.relative_to(tmp_path / "out")).replace(".", ""): r.meta["classes"] for r in results}
    assert got == expect


@pytest.mark.slow
def test_an_unknown_split_folder_is_a_usage_error(tmp_path):
    r = cli(_split_source(tmp_path / "src"), "-f", "wds", "-o", tmp_path / "out", "--splits", "train,test")
    assert_one_line(r, 2, "test", "--splits names it")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 6. --overwrite deletes only what the pack wrote
def _snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["my_thesis.tex", "experiments/", "sub/data.h5"])
def test_overwrite_refuses_a_dataset_folder_with_user_files(src, tmp_path, reference, extra):
    out = tmp_path / "out"
    import shutil

    shutil.copytree(reference["wds"], out)
    target = out / extra.rstrip("/")
    if extra.endswith("/"):
        target.mkdir()
        (target / "run1.log").write_text("results")
    else:
        target.parent.mkdir(exist_ok=True)
        target.write_text("mine")
    before = _snapshot(tmp_path)
    r = cli(*_args(src, out, "lmdb", "--overwrite"))
    assert_one_line(r, 2, str(out / extra.split("/")[0]), "refusing to delete")
    assert _snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_hand_written_journal_does_not_make_a_folder_deletable(src, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / spec.STATE_NAME).write_text(json.dumps({"format": "wds", "fingerprint": "x"}))
    (out / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path)
    assert_one_line(cli(*_args(src, out, "wds", "--overwrite")), 2, "notes.txt", "refusing to delete")
    assert _snapshot(tmp_path) == before


@pytest.mark.slow
def test_overwrite_through_a_symlink(src, tmp_path, reference):
    import shutil

    real = tmp_path / "real"
    shutil.copytree(reference["wds"], real)
    (tmp_path / "link").symlink_to(real)
    r = cli(*_args(src, tmp_path / "link", "hdf5", "--overwrite"))  # rmtree refused a symlink: traceback
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "link").is_symlink() and spec.read_index(real).format == "hdf5"
    assert not list(real.glob("*.tar"))


# ---------------------------------------------------------------- 7. --resume on a finished pack
@pytest.mark.parametrize("change, expect", [
    (["-f", "lmdb"], "format wds then, lmdb now"),
    (["--shard-count", "7"], "--shard-count 4 then, 7 now"),
    (["--max-side", "40"], "--max-side None then, 40 now"),
    (["SRC"], "the source"),
])
@pytest.mark.slow
def test_resume_on_a_finished_pack_compares_what_was_asked(src, tmp_path, reference, change, expect):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(reference["wds"], out)
    args = _args(src, out, "wds", "--resume")
    if change == ["SRC"]:
        args[0] = make_image_folder(tmp_path / "other", classes=2, per_class=2)
    elif change[0] == "-f":
        args[2] = "lmdb"
    else:
        args += change
    before = _snapshot(out)
    line = assert_one_line(cli(*args), 2, str(out), expect, "--overwrite")
    assert "{" not in line  # names the option, never the whole options dict
    assert _snapshot(out) == before


@pytest.mark.slow
def test_resume_of_an_interrupted_pack_names_the_differing_option(src, tmp_path):
    out = tmp_path / "out"
    assert pack_killed_at("packer.pipeline:_WriteStage._finish", *_args(src, out, "wds")).returncode == 137
    line = assert_one_line(cli(*_args(src, out, "wds", "--resume", "--quality", "70")), 1,
                           "other options (--quality 90 then, 70 now)")
    assert "{" not in line


# ---------------------------------------------------------------- 8. every kill point is recoverable
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
@pytest.mark.parametrize("then", ["plain", "resume", "overwrite"])
def test_killed_before_the_first_journal_write(src, tmp_path, reference, fmt, then):
    out = tmp_path / "out"
    assert pack_killed_at("packer.journal:Journal.save", *_args(src, out, fmt)).returncode == 137
    assert [p.name for p in out.iterdir()] in ([], [".pack-lock"])
    with pytest.raises(spec.DatasetFormatError):
        open_dataset(out)
    more = {"plain": [], "resume": ["--resume"], "overwrite": ["--overwrite"]}[then]
    r = cli(*_args(src, out, fmt, *more))
    assert r.returncode == 0, r.stderr  # before: all three refused; only rm -rf helped
    _same_dataset(out, reference[fmt], fmt)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_killed_after_the_index_before_the_clean_up(src, tmp_path, reference, fmt):
    out = tmp_path / "out"
    assert pack_killed_at("packer.journal:Journal.discard", *_args(src, out, fmt)).returncode == 137
    assert {spec.INDEX_NAME, spec.STATE_NAME, spec.REJECTS_NAME} <= {p.name for p in out.iterdir()}
    open_dataset(out).close()  # committed: readable already
    plain = cli(*_args(src, out, fmt))
    assert_one_line(plain, 2, "already exists", "--resume")
    r = cli(*_args(src, out, fmt, "--resume"))
    assert r.returncode == 0, r.stderr
    assert "already complete, nothing to resume: 30 samples" in r.stdout and "img/s" not in r.stdout
    assert not {spec.STATE_NAME, spec.REJECTS_NAME, "records.bin", ".pack-lock"} & {p.name for p in out.iterdir()}
    _same_dataset(out, reference[fmt], fmt)


@pytest.mark.slow
@pytest.mark.parametrize("then", ["resume", "overwrite"])
def test_a_killed_split_pack_resumes_or_is_overwritten(tmp_path, then):
    src = _split_source(tmp_path / "src")
    out = tmp_path / "out"
    assert pack_killed_at("packer.pipeline:_WriteStage._finish", src, "-f", "wds", "-o", out, "-q").returncode == 137
    assert (out / ".pack-lock").exists() and (out / "train" / spec.STATE_NAME).exists()  # stale lock at the top
    r = cli(src, "-f", "wds", "-o", out, "-q", f"--{then}")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]
    for split in ("train", "val"):
        _verified(out / split)


@pytest.mark.slow
def test_killed_while_overwrite_deletes(src, tmp_path, reference):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(reference["wds"], out)
    assert pack_killed_at("readers.contract.spec:fsync_dir", *_args(src, out, "mmap", "--overwrite")).returncode == 137
    assert not (out / spec.INDEX_NAME).exists()  # the index goes first: never a half-deleted dataset that reads
    r = cli(*_args(src, out, "mmap", "--overwrite"))
    assert r.returncode == 0, r.stderr
    _same_dataset(out, reference["mmap"], "mmap")


# ---------------------------------------------------------------- 12. --workers
@pytest.mark.slow
def test_absurd_worker_counts_are_refused(src, tmp_path):
    r = cli(src, "-f", "wds", "-o", tmp_path / "out", "--workers", "100000")
    assert_one_line(r, 2, "workers 100000 is more than this machine can use")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="more than this machine can use"):
        PackOptions(workers=100000)


# ---------------------------------------------------------------- messages: one line, right exit code
@pytest.mark.parametrize("args, expect", [
    (["--shard-size", "inf"], "not a size: 'inf'"),
    (["--shard-size", "1e30"], "not a size"),
    (["--checkpoint-bytes", "0"], "at least 1 byte"),
    (["--checkpoint-bytes", "-1"], "at least 1 byte"),
    (["--splits", "a,,b"], "expected auto, none or sub-folder names"),
])
@pytest.mark.slow
def test_bad_values_are_usage_errors(src, tmp_path, args, expect):
    r = cli(src, "-f", "lmdb", "-o", tmp_path / "out", *args)
    assert_one_line(r, 2, expect)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_read_only_output_folder(src, tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        r = cli(src, "-f", "wds", "-o", parent / "out", "-q", prefix=no_root_powers())
        assert_one_line(r, 2, str(parent / "out"), "Permission denied")
    finally:
        parent.chmod(0o755)


@pytest.mark.slow
def test_an_unreadable_class_folder(src, tmp_path):
    import shutil

    mine = shutil.copytree(src, tmp_path / "src")
    (mine / "class_01").chmod(0)
    try:
        r = cli(mine, "-f", "wds", "-o", tmp_path / "out", "-q", prefix=no_root_powers())
        assert_one_line(r, 2, str(mine / "class_01"), "cannot read the folder (Permission denied)")
    finally:
        (mine / "class_01").chmod(0o755)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_damaged_journal(src, tmp_path, reference):
    out = tmp_path / "out"
    assert pack_killed_at("packer.pipeline:_WriteStage._finish", *_args(src, out, "lmdb")).returncode == 137
    (out / spec.STATE_NAME).write_text('{"format": "lmdb", "done": ')
    r = cli(*_args(src, out, "lmdb", "--resume"))
    assert_one_line(r, 1, str(out / spec.STATE_NAME), "is damaged", "--overwrite")
    r = cli(*_args(src, out, "lmdb", "--overwrite"))  # the command the message names works
    assert r.returncode == 0, r.stderr
    _same_dataset(out, reference["lmdb"], "lmdb")


@pytest.mark.slow
@pytest.mark.parametrize("validate", [True, False])
def test_a_fifo_named_like_an_image_is_ignored(src, tmp_path, validate):
    import shutil

    mine = shutil.copytree(src, tmp_path / "src")
    os.mkfifo(mine / "class_00" / "x.jpg")
    (mine / "class_02" / "zero.jpg").symlink_to("/dev/zero")
    r = cli(mine, "-f", "wds", "-o", tmp_path / "out", "-q", "--follow-symlinks",
            *([] if validate else ["--no-validate"]), timeout=120)  # hung forever before
    assert r.returncode == 0, r.stderr
    assert "not regular files" in r.stderr and "x.jpg" in r.stderr and "zero.jpg" in r.stderr
    assert "Traceback" not in r.stderr and spec.read_index(tmp_path / "out").num_samples == 30


def test_a_name_starting_with_two_dots_is_an_image(src, tmp_path):
    import shutil

    mine = shutil.copytree(src, tmp_path / "src")
    shutil.copy(mine / "class_00" / "img_000.JPEG", mine / "class_00" / "..dots..jpg")
    shutil.copy(mine / "class_00" / "img_000.JPEG", mine / "class_00" / ".hidden.jpg")
    result = pack(mine, tmp_path / "out", PackOptions(format="wds", workers=1))[0]
    names = list(spec.read_index(tmp_path / "out").names())
    assert "class_00/..dots..jpg" in names and "class_00/.hidden.jpg" not in names
    assert result.images == 31 and result.ignored == 2  # notes.txt and the hidden file


@pytest.mark.slow
def test_every_image_rejected_leaves_only_the_rejects_list(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"bad{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    out = tmp_path / "out"
    r = cli(src, "-f", "lmdb", "-o", out, "-q")
    assert_one_line(r, 1, "every image of", "was rejected (3, listed in", "nothing was packed")
    assert sorted(p.name for p in out.iterdir()) == [spec.REJECTS_NAME]
    assert len((out / spec.REJECTS_NAME).read_text().splitlines()) == 3
    with pytest.raises(spec.DatasetFormatError, match="every one was rejected") as info:
        open_dataset(out)
    assert "--resume" not in str(info.value)
    assert_one_line(cli(src, "-f", "lmdb", "-o", out, "-q", "--resume"), 1, "nothing to resume", "--overwrite")
    make_image_folder(src, classes=1, per_class=2)
    assert cli(src, "-f", "lmdb", "-o", out, "-q", "--overwrite").returncode == 3  # packed, 3 rejected


@pytest.mark.slow
def test_sigterm_behaves_like_ctrl_c(src, tmp_path, reference):
    out = tmp_path / "out"
    first = slow_pack(*_args(src, out, "wds"), delay=0.1)
    wait_for(lambda: (out / spec.STATE_NAME).exists() and json.loads((out / spec.STATE_NAME).read_text())["done"] >= 4,
             what="a checkpoint")
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 143, err  # was -15, silently
    lines = error_lines(err)
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "--resume" in lines[0], err
    assert "Traceback" not in err
    r = cli(*_args(src, out, "wds", "--resume"))
    assert r.returncode == 0, r.stderr
    _same_dataset(out, reference["wds"], "wds")


@pytest.mark.slow
def test_ctrl_c_exit_code_and_message(src, tmp_path):
    out = tmp_path / "out"
    first = slow_pack(*_args(src, out, "hdf5"), delay=0.1)
    wait_for(lambda: (out / spec.STATE_NAME).exists(), what="the journal")
    time.sleep(0.3)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130 and "interrupted" in err and "--resume" in err and "Traceback" not in err
    assert cli(*_args(src, out, "hdf5", "--resume")).returncode == 0
