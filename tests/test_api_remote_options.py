"""``pack(..., remote=RemoteOptions(...))``: the remote arguments of ``pack`` as one frozen value (issue 32,
item 4). What applies where, and a field that cannot apply refused in one line before anything is
written or any store is reached. The uploads themselves: test_remote_pack.py (a real S3 server)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_image_folder
from packer import PackOptions, RemoteOptions, pack
from readers.remote import RetryPolicy


def test_remote_options_is_a_frozen_value_exported_from_packer():
    import packer

    assert "RemoteOptions" in packer.__all__
    opts = RemoteOptions(storage_options={"endpoint_url": "http://127.0.0.1:9"}, stage_dir="/tmp/x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.stage_dir = "/elsewhere"  # type: ignore[misc]
    assert RemoteOptions() == RemoteOptions(None, None, None, None)
    assert [f.name for f in dataclasses.fields(RemoteOptions)] == ["storage_options", "retry", "stage_dir",
                                                                   "upload_progress"]


@pytest.mark.parametrize("source, output, unused", [
    ("local", "local", ["storage_options", "retry", "stage_dir", "upload_progress"]),
    ("s3", "local", ["stage_dir", "upload_progress"]),
    ("local", "s3", []),
    ("s3", "s3", []),
], ids=["local-to-local", "s3-to-local", "local-to-s3", "s3-to-s3"])
def test_what_applies_where(source, output, unused):
    every = RemoteOptions(storage_options={}, retry=RetryPolicy(), stage_dir="stage", upload_progress=lambda s: None)
    assert every.unused(remote_source=source == "s3", remote_output=output == "s3") == unused
    assert RemoteOptions().unused(remote_source=False, remote_output=False) == []


@pytest.mark.parametrize("remote, match", [
    (RemoteOptions(stage_dir="stage"), r"^RemoteOptions stage_dir: only for an s3:// output; .* is a local folder$"),
    (RemoteOptions(upload_progress=lambda split: None, stage_dir="s"),
     r"^RemoteOptions stage_dir, upload_progress: only for an s3:// output; "),
    (RemoteOptions(storage_options={"anon": True}),
     r"^RemoteOptions storage_options: only for an s3:// output or source; "),
    (RemoteOptions(retry=RetryPolicy(tries=2)), r"^RemoteOptions retry: only for an s3:// output or source; "),
], ids=["stage_dir", "upload_progress", "storage_options", "retry"])
def test_a_field_a_local_pack_cannot_use_is_one_line_and_writes_nothing(tmp_path, remote, match):
    src = make_image_folder(tmp_path / "src", classes=2, per_class=2, size=(16, 16), png_every=0)
    out = tmp_path / "out"
    with pytest.raises(TypeError, match=match) as err:
        pack(src, out, PackOptions(format="wds", workers=1), remote=remote)
    assert "\n" not in str(err.value) and str(out) in str(err.value)
    assert not out.exists()


def test_an_s3_source_into_a_local_folder_refuses_a_staging_folder_before_any_request(tmp_path):
    """stage_dir cannot apply to a local output: refused before the (unreachable) store is listed."""
    out = tmp_path / "out"
    remote = RemoteOptions(storage_options={"endpoint_url": "http://127.0.0.1:9"}, stage_dir=tmp_path / "stage")
    with pytest.raises(TypeError, match=r"^RemoteOptions stage_dir: only for an s3:// output; "):
        pack("s3://bucket/images", out, PackOptions(format="wds", workers=1), remote=remote)
    assert not out.exists() and not (tmp_path / "stage").exists()


def test_the_old_keyword_arguments_are_gone(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=2, per_class=2, size=(16, 16), png_every=0)
    with pytest.raises(TypeError, match="storage_options"):
        pack(src, tmp_path / "out", PackOptions(format="wds", workers=1), storage_options={})  # type: ignore[call-arg]
    assert not (tmp_path / "out").exists()


def test_a_local_pack_with_empty_remote_options_packs(tmp_path):
    src = make_image_folder(tmp_path / "src", classes=2, per_class=3, size=(16, 16), png_every=0)
    [result] = pack(src, tmp_path / "out", PackOptions(format="wds", workers=1), remote=RemoteOptions())
    assert result.images == 6
