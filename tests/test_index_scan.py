"""packer.tools.index_scan: one pass over a shard gives the same CRC-32s as reading it twice (the
shard's joined from its members' and the bytes between them), through GNU and pax long names, and a
damaged header is what the scan names, even when the damage also makes a member name no field.

Every test runs twice: with the native header walk (``packer/tools/_tarwalk.c``, where the build made
it) and with the Python walk alone (``DATASET_PACKER_TARWALK=off``); odd tars give the same scan both ways."""

from __future__ import annotations

import io
import json
import shutil
import sysconfig
import tarfile
import zlib

import pytest

from packer.errors import SourceError
from packer.tools import index_scan
from packer.tools.index_scan import scan_shard, tarwalk_library
from readers.contract.safeio import checksum, checksum_combine


def samples(scan: dict) -> list[list]:
    """The scan's columns as rows: per sample [key, [[suffix, offset, size, crc, value], ...], reason]."""
    members = list(zip(scan["suffixes"], scan["offsets"], scan["sizes"], scan["crcs"], scan["values"]))
    out, at = [], 0
    for key, reason, count in zip(scan["keys"], scan["reasons"], scan["counts"]):
        out.append([key, [list(m) for m in members[at:at + count]], reason])
        at += count
    assert at == len(members)
    return out


@pytest.fixture(autouse=True, params=["native", "python"])
def walk(request, monkeypatch):
    """Which header walk the scan uses: the native one (skipped where the build could not make it) or Python's."""
    if request.param == "python":
        monkeypatch.setenv("DATASET_PACKER_TARWALK", "off")
    elif tarwalk_library() is None:
        pytest.skip("the native tar walk is not built (pip install -e . builds it where a C compiler exists)")
    return request.param


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
    got = {f"{key}.{m[0]}": (m[1], m[2], m[3]) for key, group, _reason in samples(scan) for m in group}
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
    rows = samples(scan_shard((str(tmp_path), "s.tar", None)))
    assert len(rows) == len(_JSON_MEMBERS)
    for (_key, group, reason), data in zip(rows, _JSON_MEMBERS):
        try:
            want = json.loads(data)
        except (ValueError, RecursionError):
            assert reason is not None and "not a json member" in reason, (data[:20], reason)
            continue
        assert reason is None, (data[:20], reason)
        [value] = [m[4] for m in group if m[0] == "json"]
        assert value == (want["label"] if "label" in want else None)


def test_the_native_walk_is_built_where_a_compiler_is(walk):
    """``pip install -e .`` (scripts/setup.sh) compiles packer/tools/_tarwalk.c in place when there is a cc."""
    if walk == "python":
        pytest.skip("asks for the native walk")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc})")
    assert tarwalk_library() is not None


def _header(name: str, size: int, kind: bytes = b"0", *, size_field: bytes | None = None) -> bytes:
    """A ustar header written by hand (for the number forms ``tarfile`` never writes), checksum right."""
    h = bytearray(512)
    h[:len(name)] = name.encode()
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _member(name: str, data: bytes, **kw) -> bytes:
    return _header(name, len(data), **kw) + data + bytes(-len(data) % 512)


def _odd_tar(path, *, members: int = 4200) -> None:
    """Every kind of header the two walks split between them, and enough members for several native calls."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        def add(name, data=b"", kind=tarfile.REGTYPE, fmt=None):
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            if kind == tarfile.SYMTYPE:
                info.linkname = "elsewhere"
            tar.addfile(info, io.BytesIO(data) if data else None)
        for n in range(members):
            add(f"{n:06d}.txt", f"caption {n}".encode())
            if n % 1000 == 7:
                add(f"{n:06d}-{'long-' * 30}.jpg", b"\xff\xd8" + bytes(n % 700))  # a GNU long name ('L')
                add(f"dir{n}", kind=tarfile.DIRTYPE)  # a folder and a link between samples: stepped over
                add(f"link{n}", kind=tarfile.SYMTYPE)
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("p" * 150 + ".json")  # a pax path record ('x')
        data = b'{"label": 2}'
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ustar = io.BytesIO()
    with tarfile.open(fileobj=ustar, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("u" * 90 + "/" + "k" * 60 + ".txt")  # a name split into prefix and name
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    raw = path.read_bytes().rstrip(b"\0")
    raw += bytes(-len(raw) % 512)
    raw += pax.getvalue().rstrip(b"\0") + bytes(-len(pax.getvalue().rstrip(b"\0")) % 512)
    raw += ustar.getvalue().rstrip(b"\0") + bytes(-len(ustar.getvalue().rstrip(b"\0")) % 512)
    raw += _member("z1.txt", b"spaces", size_field=b"%011o " % 6)  # a number ended by a space, not a NUL
    raw += _member("z2.txt", b"base-256", size_field=b"\x80" + (8).to_bytes(11, "big"))  # GNU's binary form
    raw += _member("z3.txt", b"after them")
    path.write_bytes(raw + bytes(1024))


def _both(tmp_path, monkeypatch, shard):
    """The scan of ``shard`` with the Python walk, then with the native one (its calls counted)."""
    monkeypatch.setenv("DATASET_PACKER_TARWALK", "off")
    try:
        python = scan_shard((str(tmp_path), shard, None))
    except SourceError as exc:
        python = str(exc)
    monkeypatch.delenv("DATASET_PACKER_TARWALK")
    lib, calls = tarwalk_library(), []

    class Counted:
        def __getattr__(self, name):
            return getattr(lib, name)

        def tw_walk(self, *args):
            calls.append(args[2]._obj.value)  # the position it starts from
            return lib.tw_walk(*args)

    monkeypatch.setattr(index_scan, "tarwalk_library", lambda: Counted())
    try:
        native = scan_shard((str(tmp_path), shard, None))
    except SourceError as exc:
        native = str(exc)
    return python, native, calls


def test_the_native_walk_gives_the_python_walks_scan(tmp_path, monkeypatch, walk):
    """Long names, pax records, ustar prefixes, folders, links, space-ended and base-256 numbers and
    4,200 members: the same samples, places, CRCs and rejects from both walks; the native one takes the
    usual headers (called from many places: after each header it leaves to Python, and per 4,096 members)."""
    if walk == "python":
        pytest.skip("compares the two walks: once is enough")
    _odd_tar(tmp_path / "s.tar")
    python, native, calls = _both(tmp_path, monkeypatch, "s.tar")
    assert isinstance(python, dict) and native == python
    keys = python["keys"]
    assert len(keys) == 4200 + 5 + 1 + 1 + 3 and "z2" in keys and "p" * 150 in keys
    assert len(calls) >= 8 and calls[0] == 0


@pytest.mark.parametrize("damage", ["checksum", "truncated", "no-end"])
def test_the_native_walk_fails_as_the_python_walk_does(tmp_path, monkeypatch, walk, damage):
    """A wrong header checksum past the first native call, a shard cut inside a member, and one cut at a
    member's end without the end-of-archive blocks: the same error or the same scan, both ways."""
    if walk == "python":
        pytest.skip("compares the two walks: once is enough")
    _odd_tar(tmp_path / "s.tar", members=5000)
    raw = bytearray((tmp_path / "s.tar").read_bytes())
    places = {s[0]: s[1][0][1:3] for s in samples(scan_shard((str(tmp_path), "s.tar", None)))}
    offset, size = places["004700"]  # well past the first native call's 4,096 members
    if damage == "checksum":
        raw[offset - 512 + 2] ^= 1  # its header's name
    elif damage == "truncated":
        del raw[offset + size // 2:]
    else:
        del raw[offset + size + -size % 512:]
    (tmp_path / "s.tar").write_bytes(bytes(raw))
    python, native, _calls = _both(tmp_path, monkeypatch, "s.tar")
    assert native == python
    if damage == "checksum":
        assert "damaged tar header at byte" in python
    elif damage == "truncated":
        assert "truncated tar file" in python
    else:
        assert isinstance(python, dict) and python["keys"]
