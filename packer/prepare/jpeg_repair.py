"""Lossless repair of JPEG headers that hold junk between their marker segments.

Some writers leave bytes between two marker segments of a JPEG header:
padding between APP14 and DQT, a stray ``FF 00``, text, or the tail of a
segment whose length field is a few bytes short. libjpeg skips such bytes
while looking for the next marker and warns ("Corrupt JPEG data: N
extraneous bytes before marker 0xdb"); the pixels are intact, but strict
decoders (simplejpeg's default, used by the readers) raise an error on the
warning, in the middle of training.

:func:`repair_header` walks the header exactly as libjpeg's ``next_marker``
does, from SOI to the first SOS, and rebuilds the file from the marker
segments libjpeg reads, in the same order, byte for byte, with the bytes it
would skip left out. Everything from SOS on (the entropy-coded data and what
follows) is kept unchanged. The result therefore decodes to exactly the
pixels libjpeg decodes from the original, without any warning: a repair,
not a re-encode (no generation loss, no change of size or quality).

Damage after the first SOS (in the entropy-coded data, or between the scans
of a progressive JPEG) is not touched here: it may mean lost pixels, and the
packer rejects such files.
"""

from __future__ import annotations

__all__ = ["repair_header"]

_SOI, _EOI, _SOS = 0xD8, 0xD9, 0xDA
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM and RST0..7 carry no length field


def _next_marker(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """libjpeg's ``next_marker`` from ``pos``: ``(position of the marker's FF, marker byte, junk bytes)``.

    Non-FF bytes are skipped (junk), runs of FF are fill (legal), ``FF 00`` is
    a stuffed zero that cannot start a marker (junk). None at the end of data.
    """
    junk, n = 0, len(data)
    while True:
        ff = data.find(b"\xff", pos)
        if ff < 0:
            return None
        junk += ff - pos
        q = ff + 1
        while q < n and data[q] == 0xFF:
            q += 1
        if q >= n:
            return None
        if data[q] != 0:
            return q - 1, data[q], junk
        junk += q + 1 - ff  # FF (FF...) 00
        pos = q + 1


def repair_header(data: bytes) -> tuple[bytes, str] | None:
    """``(repaired bytes, what was removed)`` when junk lies between the header's marker segments;
    None when the header is clean, or cannot be walked (not a JPEG, truncated header: left to the decoder).
    """
    if data[:2] != b"\xff\xd8":
        return None
    pos, pieces, removed = 2, [data[:2]], []
    while True:
        found = _next_marker(data, pos)
        if found is None:
            return None
        start, marker, junk = found
        if junk:
            removed.append(f"{junk} byte{'s' if junk != 1 else ''} before marker 0x{marker:02x}")
        if marker == _SOS:
            pieces.append(data[start:])
            break
        if marker in (_SOI, _EOI):
            return None  # no image data before the end: nothing a repair could save
        if marker in _STANDALONE:
            end = start + 2
        else:
            if start + 4 > len(data):
                return None
            length = int.from_bytes(data[start + 2:start + 4], "big")
            end = start + 2 + length
            if length < 2 or end > len(data):
                return None
        pieces.append(data[start:end])
        pos = end
    if not removed:
        return None
    return b"".join(pieces), "removed junk from the JPEG header: " + ", ".join(removed)
