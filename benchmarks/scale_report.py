"""The scale benchmark's report (``benchmarks/bench_scale.py``): ratios to the previous N, the printed
tables and the issue's checks (:func:`checks`: each missed figure as one line).
"""

from __future__ import annotations

from typing import Any

import numpy as np

COLUMNS = [  # key, heading, kind (s, B, /s, us, n)
    ("scan_s", "scan", "s"), ("images_per_s", "pack img/s", "/s"), ("pack_rss", "pack RSS", "B"),
    ("pack_private", "pack private", "B"),
    ("open_first_s", "first open", "s"), ("open_s", "open", "s"), ("open_private", "open private", "B"), ("open_mapped", "open mapped", "B"),
    ("random_us", "random read", "us"), ("first_batch_s", "first batch", "s"),
    ("worker_private", "worker private", "B"), ("worker_peak", "worker peak", "B"), ("order_s", "order", "s"), ("order_base_s", "permutation", "s"),
    ("order_peak", "order peak", "B"),
    ("state_bytes", "state_dict", "n"), ("resume_s", "resume (8 ranks)", "s"), ("resume_peak", "resume peak", "B"),
    ("info_s", "info", "s"), ("info_rss", "info RSS", "B"), ("verify_s", "verify", "s"), ("verify_rss", "verify RSS", "B"),
    ("disk_ratio", "disk / payload", "x"),
]


def _fmt(value: float, kind: str) -> str:
    if kind == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if kind == "B":
        return f"{value / 2**20:.1f} MB"
    if kind == "/s":
        return f"{value:,.0f}"
    if kind == "us":
        return f"{value:.0f} µs"
    if kind == "x":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def per_10x(ratio: float, step: float) -> float:
    """A cost's ``ratio`` between two sizes ``step`` apart (``step`` = their ratio of N), per 10x of N."""
    return ratio ** (1 / np.log10(step)) if step > 1 else ratio


def ratios(rows: list[dict[str, Any]]) -> None:
    """Add ``ratio[key]``: each figure over the same format's previous N, and ``per10``: that ratio per 10x of N."""
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        prev = last.get(row["format"])
        row["ratio"], row["per10"] = {}, {}
        if prev is not None:
            step = row["n"] / prev["n"]
            for key, _, kind in COLUMNS:
                a, b = prev.get(key), row.get(key)
                if a and b and kind not in ("n", "x"):
                    r = b / a
                    row["ratio"][key] = r
                    row["per10"][key] = per_10x(r, step)
        last[row["format"]] = row


GROUPS = {  # the printed tables: one per stage, so that each fits a page
    "packing": ("scan_s", "images_per_s", "pack_rss", "pack_private", "disk_ratio", "verify_s", "verify_rss"),
    "opening and reading": ("open_first_s", "open_s", "open_private", "open_mapped", "random_us", "first_batch_s", "worker_private",
                            "worker_peak",
                            "info_s", "info_rss"),
    "epoch order and resume": ("order_s", "order_base_s", "order_peak", "state_bytes", "resume_s", "resume_peak"),
}


def tables(rows: list[dict[str, Any]]) -> str:
    """One markdown table per :data:`GROUPS` entry (rows without any of its figures left out)."""
    out = []
    for title, keys in GROUPS.items():
        part = [r for r in rows if any(k in r for k in keys)]
        if part:
            out += [f"{title}:", "", table(part, keys), ""]
    return "\n".join(out)


def table(rows: list[dict[str, Any]], only: tuple[str, ...] | None = None) -> str:
    keys = [(k, h, kind) for k, h, kind in COLUMNS if any(k in r for r in rows) and (only is None or k in only)]
    head = "| format | N | kind | " + " | ".join(h for _, h, _ in keys) + " |"
    lines = [head, "|---|---:|---|" + "---:|" * len(keys)]
    for r in rows:
        cells = []
        for k, _, kind in keys:
            if k not in r:
                cells.append("–")
                continue
            text = _fmt(r[k], kind)
            if k in r.get("ratio", {}):
                text += f" ({r['ratio'][k]:.1f}x)"
            cells.append(text)
        lines.append(f"| {r['format']} | {r['n']:,} | {r['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checks(rows: list[dict[str, Any]], curve: list[dict[str, Any]] = ()) -> list[str]:
    """The issue's Done-when figures that these rows can show, as failures (empty: all met)."""
    bad = []
    # the order past the CPU's cache: ~11x per 10x of N here (numpy's permutation 23-27x), far under a square's 100x
    if curve and "per10" in curve[-1] and curve[-1]["per10"] >= 20:
        bad.append(f"the wds worker order grows {curve[-1]['per10']:.1f}x per 10x of N at {curve[-1]['n']:,}")
    # costs that must not grow faster than N: at most 12x per 10x of N
    linear = ("scan_s", "pack_rss", "pack_private", "open_first_s", "open_s", "open_private", "worker_private", "worker_peak",
              "order_s", "order_peak",
              "resume_s", "resume_peak", "info_s", "info_rss", "verify_s", "verify_rss", "state_bytes")
    kinds = {k: kd for k, _, kd in COLUMNS}
    previous: dict[str, dict[str, Any]] = {}
    for r in rows:
        prev, previous[r["format"]] = previous.get(r["format"]), r
        for key in linear:
            per10 = r.get("per10", {}).get(key)
            floor = {"s": 0.05, "B": 8 << 20}.get(kinds[key], 0)
            # judged where both figures are above the floor: a ratio of milliseconds is the machine's noise
            if per10 is not None and per10 > 12 and prev is not None and min(prev[key], r[key]) >= floor:
                bad.append(f"{r['format']} {key} grows {per10:.1f}x per 10x of N at {r['n']:,}")
        if r.get("worker_private", 0) > 64 << 20:
            bad.append(f"{r['format']} per-worker private memory {r['worker_private'] / 2**20:.0f} MB at {r['n']:,}")
        if r.get("worker_peak", 0) > 64 << 20:  # the peak while the order is built counts (64 workers on a node)
            bad.append(f"{r['format']} per-worker peak private memory during its order "
                       f"{r['worker_peak'] / 2**20:.0f} MB at {r['n']:,}")
        if r["n"] >= 1_000_000 and r.get("open_s", 0) > 1.0:
            bad.append(f"{r['format']} open takes {r['open_s']:.2f} s at {r['n']:,}")
        if r["n"] >= 1_000_000 and r.get("open_first_s", 0) > 1.0:
            bad.append(f"{r['format']} first open takes {r['open_first_s']:.2f} s at {r['n']:,}")
        if r["n"] >= 1_000_000 and r.get("resume_s", 0) > 2.0:
            bad.append(f"{r['format']} exact resume takes {r['resume_s']:.2f} s per rank at {r['n']:,}")
    packs = {}
    for r in rows:
        if r["kind"] == "pack" and "pack_private" in r:
            packs.setdefault(r["format"], []).append(r)
    for fmt, rs in packs.items():  # private memory: the mapped files are page cache, counted apart
        if len(rs) >= 2 and rs[-1]["n"] >= 1_000_000 and rs[-1]["pack_private"] > 1.5 * rs[-2]["pack_private"]:
            bad.append(f"{fmt} packer peak private memory at {rs[-1]['n']:,} is "
                       f"{rs[-1]['pack_private'] / rs[-2]['pack_private']:.2f}x its value at {rs[-2]['n']:,}")
    return bad


def curve_table(curve: list[dict[str, Any]]) -> str:
    lines = ["wds epoch order of one worker (8 ranks x 8 workers), on the shard layout alone:", "",
             "| N | share | order | per sample | per 10x of N | permutation | per sample | per 10x of N |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in curve:
        grow = f"{r['per10']:.1f}x" if "per10" in r else "–"
        base = f"{r['base_per10']:.1f}x" if "base_per10" in r else "–"
        lines.append(f"| {r['n']:,} | {r['share']:,} | {r['order_s'] * 1e3:.1f} ms | {r['order_s'] / r['share'] * 1e9:.1f} ns "
                     f"| {grow} | {r['order_base_s'] * 1e3:.1f} ms | {r['order_base_s'] / r['share'] * 1e9:.1f} ns | {base} |")
    return "\n".join(lines)
