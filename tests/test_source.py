"""Scanning an ImageFolder tree (packer.sources.source): which files are samples, their labels and order,
symlinks, odd file names, and split detection. Expectations come from torchvision's ImageFolder
rules, re-implemented in reference.imagefolder_reference (torchvision is not installed)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import make_image_folder
from packer import PackOptions, pack
from packer.sources.source import SourceError, find_split_dirs, scan
from reference import imagefolder_reference


def img(path: Path, color=(10, 20, 30), size=(12, 10)) -> Path:
    """A real, tiny image at ``path``; JPEG or PNG by the name's suffix (any case), else PNG content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = "JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else "PNG"
    with open(path, "wb") as f:
        Image.new("RGB", size, color).save(f, fmt)
    return path


def text(path: Path, content: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def read_names(ds: Path) -> list[str]:
    return [json.loads(line) for line in (ds / "names.jsonl").read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- which files are images
def test_extensions_in_any_case(tmp_path):
    included = ["a.jpg", "b.JPG", "c.jpeg", "d.JPEG", "e.Jpeg", "f.png", "g.PNG", "h.pNg", "x.png.JPG",
                "j.bmp", "k.webp", "l.tif", "s.TIFF", "t.ppm", "u.PGM", "v.mpo"]  # all of test_extensions.py
    excluded = ["i.gif", "m.txt", "n.jpg.txt", "o", "p.jpg~", "q.jpe", "r.JPG.bak", "w.jp2", "y.heic"]
    for name in included:
        img(tmp_path / "cls" / name)
    for name in excluded:
        text(tmp_path / "cls" / name)
    src = scan(tmp_path)
    assert src.classes == ["cls"]
    assert src.paths == sorted(f"cls/{n}" for n in included)
    assert sorted(src.ignored) == sorted(f"cls/{n}" for n in excluded)
    assert src.labels == [0] * len(included)
    assert src.sizes == [(tmp_path / p).stat().st_size for p in src.paths]
    assert src.total_bytes == sum(src.sizes)


def test_hidden_files_and_folders_are_skipped(tmp_path):
    img(tmp_path / "cls" / "ok.jpg")
    img(tmp_path / "cls" / ".hidden.jpg")
    img(tmp_path / "cls" / "._ok.jpg")  # macOS AppleDouble file: not an image despite its name
    img(tmp_path / ".git" / "x.jpg")  # hidden folder at class level: not a class
    text(tmp_path / ".DS_Store")  # hidden loose file: not even counted
    src = scan(tmp_path)
    assert src.classes == ["cls"]
    assert src.paths == ["cls/ok.jpg"]
    assert sorted(src.ignored) == ["cls/._ok.jpg", "cls/.hidden.jpg"]


def test_non_images_are_ignored_and_counted(tmp_path):
    make_image_folder(tmp_path / "src", classes=2, per_class=2)  # writes class_00/notes.txt
    text(tmp_path / "src" / "class_01" / "labels.csv")
    text(tmp_path / "src" / "README.md")  # loose files in the root: ignored by name
    img(tmp_path / "src" / "stray.jpg")  # an image directly in the root is no sample either
    src = scan(tmp_path / "src")
    assert len(src.paths) == 4
    assert sorted(src.ignored) == ["README.md", "class_00/notes.txt", "class_01/labels.csv", "stray.jpg"]
    (result,) = pack(tmp_path / "src", tmp_path / "out", PackOptions(format="wds", workers=1))
    assert result.ignored == 4
    meta = json.loads((tmp_path / "out" / "index.json").read_text())
    assert meta["source"]["ignored_files"] == 4 and meta["source"]["images_found"] == 4
    assert "4 non-image files ignored" in result.summary()


def test_images_only_in_the_root_get_a_hint(tmp_path):
    img(tmp_path / "a.jpg")
    img(tmp_path / "b.png")
    with pytest.raises(SourceError, match="no images found.*one sub-folder per class"):
        scan(tmp_path)


@pytest.mark.parametrize("kind", ["missing", "file", "empty", "only-text"])
def test_unusable_sources(tmp_path, kind):
    root = tmp_path / "src"
    if kind == "file":
        text(root)
    elif kind == "empty":
        root.mkdir()
    elif kind == "only-text":
        text(root / "cls" / "a.txt")
        (root / "empty_cls").mkdir()
    match = {"missing": "no such folder", "file": "not a folder"}.get(kind, "no images found")
    with pytest.raises(SourceError, match=match):
        scan(root)


# ---------------------------------------------------------------- labels and order
def test_labels_and_order_follow_imagefolder(tmp_path):
    names = ["img_10.jpg", "img_2.jpg", "B.jpg", "a.jpg", "_x.png", "Z.PNG", "a b.jpeg"]
    for cls in ("zebra", "Apple", "mango", "10", "9"):
        for n in names:
            img(tmp_path / cls / n)
    src = scan(tmp_path)
    classes, reference = imagefolder_reference(tmp_path)
    assert src.classes == classes == sorted(["zebra", "Apple", "mango", "10", "9"])  # "10" < "9" < "Apple"
    assert list(zip(src.paths, src.labels)) == reference
    assert src.paths[:7] == ["10/B.jpg", "10/Z.PNG", "10/_x.png", "10/a b.jpeg", "10/a.jpg", "10/img_10.jpg",
                             "10/img_2.jpg"]


def test_nested_folders_keep_the_class_label(tmp_path):
    img(tmp_path / "cat" / "top.jpg")
    img(tmp_path / "cat" / "sub" / "deeper" / "x.jpg")
    img(tmp_path / "cat" / "sub" / "y.png")
    img(tmp_path / "dog" / "a" / "b" / "c" / "d.jpg")
    src = scan(tmp_path)
    assert src.classes == ["cat", "dog"]
    assert dict(zip(src.paths, src.labels)) == {
        "cat/top.jpg": 0, "cat/sub/deeper/x.jpg": 0, "cat/sub/y.png": 0, "dog/a/b/c/d.jpg": 1}


def test_nested_order_matches_torchvision(tmp_path):
    img(tmp_path / "cls" / "z.jpg")
    img(tmp_path / "cls" / "a" / "b.jpg")
    img(tmp_path / "cls" / "a-b" / "c.jpg")
    src = scan(tmp_path)
    _classes, reference = imagefolder_reference(tmp_path)
    # torchvision: cls/z.jpg, cls/a/b.jpg, cls/a-b/c.jpg; the packer: cls/a-b/c.jpg, cls/a/b.jpg, cls/z.jpg
    assert src.paths == [rel for rel, _ in reference]


def test_empty_class_folder_keeps_its_label_index(tmp_path, caplog):
    img(tmp_path / "a" / "1.jpg")
    (tmp_path / "b").mkdir()  # no images at all
    text(tmp_path / "c" / "readme.txt")  # only non-images
    img(tmp_path / "d" / "2.jpg")
    img(tmp_path / "d" / "3.jpg")
    with caplog.at_level(logging.WARNING, logger="packer.sources.source"):
        src = scan(tmp_path)
    assert src.classes == ["a", "b", "c", "d"]
    assert src.labels == [0, 3, 3]
    assert "2 class folder(s) hold no images" in caplog.text and "b, c" in caplog.text
    pack(tmp_path, tmp_path.parent / "out", PackOptions(format="hdf5", workers=1))
    meta = json.loads((tmp_path.parent / "out" / "index.json").read_text())
    assert meta["classes"] == ["a", "b", "c", "d"] and meta["class_counts"] == [1, 0, 0, 2]
    np.testing.assert_array_equal(np.load(tmp_path.parent / "out" / "labels.npy"), [0, 3, 3])


def test_fingerprint_tracks_names_sizes_and_labels(tmp_path):
    img(tmp_path / "a" / "1.jpg")
    img(tmp_path / "b" / "2.jpg")
    first = scan(tmp_path).fingerprint()
    assert scan(tmp_path).fingerprint() == first
    img(tmp_path / "b" / "2.jpg", size=(40, 40))  # same name, new size
    second = scan(tmp_path).fingerprint()
    assert second != first
    (tmp_path / "b").rename(tmp_path / "c")  # same files, another class name
    assert scan(tmp_path).fingerprint() != second


# ---------------------------------------------------------------- symlinks
@pytest.fixture
def linked(tmp_path):
    """SRC with file/dir symlinks pointing inside and outside it."""
    outside = tmp_path / "outside"
    img(outside / "o1.jpg")
    img(outside / "sub" / "o2.jpg")
    src = tmp_path / "src"
    img(src / "cat" / "in.jpg")
    img(src / "dog" / "d.jpg")
    (src / "cat" / "link_out.jpg").symlink_to(outside / "o1.jpg")
    (src / "cat" / "link_in.jpg").symlink_to(src / "dog" / "d.jpg")
    return src, outside


def test_file_symlinks_outside_the_source_are_skipped(linked):
    src_dir, _outside = linked
    src = scan(src_dir)
    assert src.paths == ["cat/in.jpg", "cat/link_in.jpg", "dog/d.jpg"]  # a link inside SRC is fine
    assert src.skipped_links == ["cat/link_out.jpg"]
    followed = scan(src_dir, follow_symlinks=True)
    assert followed.paths == ["cat/in.jpg", "cat/link_in.jpg", "cat/link_out.jpg", "dog/d.jpg"]
    assert followed.skipped_links == []


def test_skipped_symlinks_are_reported(linked, tmp_path):
    src_dir, _outside = linked
    (result,) = pack(src_dir, tmp_path / "out", PackOptions(format="wds", workers=1))
    assert result.images == 3 and result.skipped_links == 1
    assert "1 symlinks outside the source skipped" in result.summary()
    assert json.loads((tmp_path / "out" / "index.json").read_text())["source"]["skipped_symlinks"] == 1
    (result,) = pack(src_dir, tmp_path / "out2", PackOptions(format="wds", workers=1, follow_symlinks=True))
    assert result.images == 4 and result.skipped_links == 0
    assert read_names(tmp_path / "out2")[2] == "cat/link_out.jpg"


def test_folder_symlinks_are_followed_only_when_asked(linked):
    src_dir, outside = linked
    (src_dir / "cat" / "linkdir").symlink_to(outside / "sub", target_is_directory=True)
    assert "cat/linkdir/o2.jpg" not in scan(src_dir).paths
    assert "cat/linkdir/o2.jpg" in scan(src_dir, follow_symlinks=True).paths


def test_folder_symlinks_outside_the_source_are_counted(linked):
    src_dir, outside = linked
    (src_dir / "cat" / "linkdir").symlink_to(outside / "sub", target_is_directory=True)
    assert "cat/linkdir" in scan(src_dir).skipped_links


def test_class_folder_symlink_outside_the_source_is_skipped(linked):
    src_dir, outside = linked
    (src_dir / "zebra").symlink_to(outside, target_is_directory=True)
    src = scan(src_dir)
    assert not any(p.startswith("zebra/") for p in src.paths)
    assert "zebra" in src.skipped_links


# ---------------------------------------------------------------- odd names
ODD = ["ünïcødé 画像.jpg", "with space.jpeg", "many.dots.v1.2.png", "-dash.JPG", "quote's.png", "emoji😀.jpg",
       "tab\tname.jpg", "new\nline.png", 'dq".jpg', "back\\slash.jpg"]


def test_unicode_space_and_dot_names(tmp_path):
    src_dir = tmp_path / "src"
    for cls in ("çlass ü", "class with space", "dotted.class"):
        for n in ODD:
            img(src_dir / cls / n)
    src = scan(src_dir)
    classes, reference = imagefolder_reference(src_dir)
    assert src.classes == classes == ["class with space", "dotted.class", "çlass ü"]
    assert list(zip(src.paths, src.labels)) == reference
    for fmt in ("wds", "lmdb"):
        pack(src_dir, tmp_path / fmt, PackOptions(format=fmt, workers=2, order="source"))
        assert read_names(tmp_path / fmt) == src.paths  # names.jsonl round-trips every name
        np.testing.assert_array_equal(np.load(tmp_path / fmt / "labels.npy"), src.labels)


def test_non_utf8_file_name(tmp_path):
    src_dir = tmp_path / "src"
    img(src_dir / "cls" / "ok.jpg")
    raw = os.fsencode(src_dir / "cls") + b"/caf\xe9.jpg"
    img(Path(os.fsdecode(raw)))
    src = scan(src_dir)
    assert src.paths == ["cls/caf\udce9.jpg", "cls/ok.jpg"]
    pack(src_dir, tmp_path / "out", PackOptions(format="wds", workers=1))
    assert [os.fsencode(n) for n in read_names(tmp_path / "out")] == [b"cls/caf\xe9.jpg", b"cls/ok.jpg"]


# ---------------------------------------------------------------- splits
def test_plain_imagefolder_has_no_splits(tmp_path):
    make_image_folder(tmp_path, classes=2, per_class=1)
    assert find_split_dirs(tmp_path) == []


def test_train_val_folders_are_splits(tmp_path):
    make_image_folder(tmp_path / "train", classes=2, per_class=2)
    make_image_folder(tmp_path / "val", classes=2, per_class=1)
    make_image_folder(tmp_path / "test", classes=1, per_class=1)
    text(tmp_path / "docs" / "README.md")  # a folder without images is no split
    img(tmp_path / ".cache" / "c" / "x.jpg")  # hidden: never a split
    text(tmp_path / "LICENSE")
    assert find_split_dirs(tmp_path) == [tmp_path / "test", tmp_path / "train", tmp_path / "val"]


def test_a_folder_with_images_inside_means_no_splits(tmp_path):
    make_image_folder(tmp_path / "train", classes=2, per_class=1)
    img(tmp_path / "cats" / "x.jpg")  # a class with direct images: the root is one ImageFolder
    assert find_split_dirs(tmp_path) == []


def test_images_only_deeper_than_split_class_level_mean_no_splits(tmp_path):
    img(tmp_path / "a" / "b" / "c" / "x.jpg")  # root/<class>/<sub>/<sub>/<img>
    img(tmp_path / "d" / "e" / "f" / "y.jpg")
    assert find_split_dirs(tmp_path) == []
    assert scan(tmp_path).paths == ["a/b/c/x.jpg", "d/e/f/y.jpg"]


def test_pack_writes_one_dataset_per_split(tmp_path):
    make_image_folder(tmp_path / "src" / "train", classes=2, per_class=3)
    make_image_folder(tmp_path / "src" / "val", classes=2, per_class=1, seed=3)
    results = pack(tmp_path / "src", tmp_path / "out", PackOptions(format="wds", workers=1))
    assert [(r.split, r.images, r.out.name) for r in results] == [("train", 6, "train"), ("val", 2, "val")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train", "val"]


def test_split_names_that_collide_are_refused(tmp_path):
    make_image_folder(tmp_path / "src" / "train set", classes=1, per_class=1)
    make_image_folder(tmp_path / "src" / "train_set", classes=1, per_class=2)
    with pytest.raises(SourceError):
        pack(tmp_path / "src", tmp_path / "out", PackOptions(format="wds", workers=1))
