"""packer.tools.index_scan: one pass over a shard gives the same CRC-32s as reading it twice (the
shard's joined from its members' and the bytes between them), through GNU and pax long names, and a
damaged header is what the scan names, even when the damage also makes a member name no field."""

from __future__ import annotations

import io
import json
import tarfile
import zlib

import pytest

from packer.errors import SourceError
from packer.tools.index_scan import scan_shard
from readers.contract.safeio import checksum, checksum_combine


def _shard(path, fmt: int) -> dict[str, bytes]:
    members = {}
    with tarfile.open(path, "w", format=fmt) as tar:
        for n in range(5):
            key = f"{'long-key-' * 12 if n == 2 else ''}{n:04d}"  # > 100 bytes: a GNU or pax name record
            for ext, data in (("jpg", bytes([n]) * (700 + 300 * n)), ("txt", f"caption {n}".encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                members[f"{key}.{ext}"] = data
    return members


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_one_pass_gives_the_shard_and_member_crcs(tmp_path, fmt):
    if fmt == tarfile.USTAR_FORMAT:
        members = {}
        with tarfile.open(tmp_path / "s.tar", "w", format=fmt) as tar:
            for n in range(3):
                info = tarfile.TarInfo(f"{n:04d}.jpg")
                info.size = 10 + n
                tar.addfile(info, io.BytesIO(b"x" * (10 + n)))
                members[info.name] = b"x" * (10 + n)
    else:
        members = _shard(tmp_path / "s.tar", fmt)
    raw = (tmp_path / "s.tar").read_bytes()
    scan = scan_shard((str(tmp_path), "s.tar", None))
    assert scan["crc32"] == zlib.crc32(raw) and scan["bytes"] == len(raw)
    got = {f"{key}.{m[0]}": (m[1], m[2], m[3]) for key, group, _reason in scan["samples"] for m in group}
    assert sorted(got) == sorted(members)
    for name, (offset, size, crc) in got.items():
        assert raw[offset:offset + size] == members[name] and crc == zlib.crc32(members[name])


def test_a_damaged_header_is_named_before_what_it_caused(tmp_path):
    _shard(tmp_path / "s.tar", tarfile.GNU_FORMAT)
    raw = bytearray((tmp_path / "s.tar").read_bytes())
    raw[6] = ord("+")  # the first member's name: "0000.j+g" is no field name, and its header checksum is wrong
    (tmp_path / "s.tar").write_bytes(raw)
    with pytest.raises(SourceError, match="damaged tar header at byte 0"):
        scan_shard((str(tmp_path), "s.tar", None))


def test_checksum_combine_is_the_checksum_of_both():
    a, b = b"header" * 100, b"member data" * 1000
    assert checksum_combine(checksum(a), checksum(b), len(b)) in (checksum(a + b), None)  # None: no ISA-L


_JSON_MEMBERS = [b'{"label": 3}', b' {"label": 4}\n', b'\xef\xbb\xbf{"label": 5}', '{"label": 6}'.encode("utf-16"),
                 b'[1', b'1 2', b'"\xff"', b'{"a": 1}x', b'', b'[' * 100_000, b'{"caption": "x"}']


def test_json_members_are_judged_as_json_loads_judges_them(tmp_path):
    """The scan's fast JSON path: a .json member parses in the scan exactly when ``json.loads`` parses it
    (a BOM, UTF-16, blanks around it, a deep nest), and a label is the value json.loads gives."""
    with tarfile.open(tmp_path / "s.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for n, data in enumerate(_JSON_MEMBERS):
            for ext, body in (("jpg", b"\xff\xd8" + bytes([n]) * 50), ("json", data)):
                info = tarfile.TarInfo(f"{n:04d}.{ext}")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    samples = scan_shard((str(tmp_path), "s.tar", None))["samples"]
    assert len(samples) == len(_JSON_MEMBERS)
    for (_key, group, reason), data in zip(samples, _JSON_MEMBERS):
        try:
            want = json.loads(data)
        except (ValueError, RecursionError):
            assert reason is not None and "not a json member" in reason, (data[:20], reason)
            continue
        assert reason is None, (data[:20], reason)
        [value] = [m[4] for m in group if m[0] == "json"]
        assert value == (want["label"] if "label" in want else None)
