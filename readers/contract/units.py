"""The one size parser: ``--shard-size 256MB``, ``--checkpoint-bytes``, ``cache_limit="200GB"``.

Units are binary, whatever the spelling, as the command line has always
documented them (``--shard-size`` default "256MB" is 268,435,456 bytes):

* ``k``, ``K``, ``KB``, ``KiB``: 2**10 bytes
* ``M``, ``MB``, ``MiB``: 2**20
* ``G``, ``GB``, ``GiB``: 2**30
* ``T``, ``TB``, ``TiB``: 2**40
* ``P``, ``PB``, ``PiB``: 2**50

A plain number (``4096``, or an ``int``) is bytes; fractions are allowed
(``1.5G``) and rounded down; case and spaces do not matter. Anything else,
a negative size, or one of 8 EiB or more is a ``ValueError`` with a
one-line reason. :func:`format_size` writes the shortest spelling that
reads back exactly.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_size", "format_size", "UNITS"]

#: unit letter -> bytes (binary)
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

_SIZE = re.compile(r"^(-?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)([kmgtp]?)(i?b?)$")
_EXAMPLES = "e.g. 256MB, 1GiB, 500k, 4096"


def parse_size(value: int | float | str, minimum: int = 0) -> int:
    """Bytes from ``"256MB"`` (256 * 2**20), ``"1GiB"``, ``"1.5T"``, ``"500k"``, ``4096`` or an int;
    at least ``minimum`` bytes."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r} ({_EXAMPLES})")
    if isinstance(value, (int, float)):
        number, scale = float(value), 1
        if isinstance(value, int):
            if value < minimum:
                raise ValueError(f"must be at least {minimum} byte{'s' if minimum != 1 else ''}, got {value!r}")
            if value >= 2**63:
                raise ValueError(f"not a size: {value!r} (a number of bytes below 8 EiB, {_EXAMPLES})")
            return value
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        m = _SIZE.match(text)
        if not m or (m.group(3) and not m.group(2) and m.group(3) != "b"):  # "5ib" is not a size
            raise ValueError(f"not a size: {value!r} ({_EXAMPLES})")
        number, scale = float(m.group(1)), UNITS[m.group(2)]
    else:
        raise ValueError(f"not a size: {value!r} ({_EXAMPLES})")
    if not math.isfinite(number):
        raise ValueError(f"not a size: {value!r} ({_EXAMPLES})")
    if number * scale >= 2**63:
        raise ValueError(f"not a size: {value!r} (a number of bytes below 8 EiB, {_EXAMPLES})")
    if int(number * scale) < minimum:
        raise ValueError(f"must be at least {minimum} byte{'s' if minimum != 1 else ''}, got {value!r}")
    return int(number * scale)


def format_size(n: int) -> str:
    """The shortest spelling that :func:`parse_size` reads back as ``n`` (``256MB``, ``500k``)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("k", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)
