"""Packing options, grouped in one frozen dataclass shared by the API and the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from readers.spec import FORMATS

__all__ = ["PackOptions", "DEFAULT_SHARD_SIZE", "parse_size"]

DEFAULT_SHARD_SIZE = 256 * 1024 * 1024  # 256 MiB: large sequential reads, ~2.5k ImageNet images


def parse_size(text: str | int) -> int:
    """Parse ``"256MB"``, ``"1GiB"``, ``"500k"`` or a plain byte count."""
    if isinstance(text, int):
        return text
    s = text.strip().lower().replace(" ", "")
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
             "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
    num = s.rstrip("kmgibKMGIB")
    unit = s[len(num):]
    if unit not in units or not num:
        raise ValueError(f"not a size: {text!r} (use e.g. 256MB, 1GB, 500k)")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 256MB, 1GB, 500k)") from None
    return int(value * units[unit])


@dataclass(frozen=True)
class PackOptions:
    """Everything that decides what ``pack`` writes. Recorded in each index."""

    format: str = "wds"
    workers: int | None = None  # None: the CPUs this process may use (cgroup-aware)
    shard_size: int = DEFAULT_SHARD_SIZE  # wds: roll over to a new shard past this many bytes
    shard_count: int | None = None  # wds: ...or past this many samples
    max_side: int | None = None  # downscale so the longer side <= this, re-encode at quality
    quality: int = 90  # JPEG quality for re-encoded images
    resize: int | None = None  # mmap: shorter side to this, center crop to resize x resize
    validate: bool = True  # decode every image once at pack time
    strict: bool = False  # stop at the first rejected image
    max_pixels: int = 178_956_970  # decompression-bomb limit (pixels)
    follow_symlinks: bool = False  # follow symlinks that point outside SRC
    overwrite: bool = False
    resume: bool = False
    checkpoint_bytes: int = 64 * 1024 * 1024  # lmdb/hdf5/mmap: durable commit every this many bytes
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}; choose one of {', '.join(FORMATS)}")
        for name in ("workers", "shard_count", "max_side", "resize"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1 byte, got {self.shard_size}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.resize is not None and self.format != "mmap":
            raise ValueError("resize applies to the mmap format only; use max_side for the others")
        if self.overwrite and self.resume:
            raise ValueError("choose either overwrite (start again) or resume (continue), not both")

    def recorded(self) -> dict[str, Any]:
        """The options that shape the output (stored in the index, compared on resume)."""
        d = asdict(self)
        for volatile in ("workers", "overwrite", "resume", "strict"):
            d.pop(volatile)
        return d
