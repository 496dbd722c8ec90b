"""The progress bar of the packer's commands and of ``pack_map``: one tqdm setup, so every bar looks
and behaves the same (``pack``, ``convert``, ``upload``, ``verify``, ``download``, ``pack_map``).

    from packer.progress import bar

    b = bar(len(paths), "img", "pack train", quiet=args.quiet)   # None when quiet
    if b is not None:
        b.update(1)
        b.close()

The bar is tqdm's (to stderr, so a command's stdout stays its result), redrawn at most every
:data:`MININTERVAL` seconds (a bar costs nothing next to the work it counts, even at thousands of
updates a second), as wide as the terminal is now (``dynamic_ncols``: a resized window is not
garbled), its rate smoothed over many updates (:data:`SMOOTHING`: images and uploads vary a lot
in cost, and a raw rate jumps).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["bar", "upload_bars", "download_bar", "MININTERVAL", "SMOOTHING"]

MININTERVAL = 0.5  # seconds between redraws
SMOOTHING = 0.05  # tqdm's exponential moving average factor for the rate (0: overall average, 1: instant)


def bar(total: int | None, unit: str, desc: str, quiet: bool = False) -> Any:
    """A tqdm bar labelled ``desc`` counting ``unit`` toward ``total`` (None: not known), or None when
    ``quiet``. ``unit="B"`` counts bytes, shown scaled by 1024 (``12.3MB`` is 12.3 MiB). The caller
    updates it (``update(n)``; ``n``, ``total`` and ``set_postfix_str`` are tqdm's) and closes it."""
    if quiet:
        return None
    from tqdm import tqdm  # here, not at import: ``import packer`` does not load it

    scale: dict[str, Any] = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, mininterval=MININTERVAL,
                smoothing=SMOOTHING, **scale)


def upload_bars(quiet: bool) -> Callable[[str], Callable[[int], None] | None]:
    """``split -> callback(nbytes)`` drawing an ``upload SPLIT`` byte bar (an s3://, gs:// or az:// output's
    ``RemoteOptions.upload_progress``), or giving None for every split when ``quiet``."""
    def factory(split: str) -> Callable[[int], None] | None:
        b = bar(None, "B", f"upload {split}", quiet)
        return None if b is None else b.update

    return factory


def download_bar(quiet: bool) -> Callable[[int, int], None] | None:
    """``callback(done, total)`` drawing a ``download`` byte bar (the data file of a remote lmdb, hdf5 or mmap
    dataset), closed when ``done`` reaches ``total``; None when ``quiet``."""
    if quiet:
        return None
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        b = state.get("bar")
        if b is None:
            b = state["bar"] = bar(total, "B", "download")
        b.update(done - b.n)
        if done >= total:
            b.close()

    return update
