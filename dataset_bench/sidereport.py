"""The side-by-side run (:mod:`dataset_bench.sidebyside`) as targets met / not met, tables and a chart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dataset_bench.sidebyside import FORMATS

__all__ = ["targets", "report", "draw_side_chart"]


def _rate(result: dict[str, Any], who: str, name: str, mode: str, workers: int,
          kind: str | None = None) -> float | None:
    rates = [r["samples_per_s"] for r in result["reads"]
             if (r["who"], r["name"], r["mode"], r["workers"]) == (who, name, mode, workers)
             and (kind is None or r["kind"] == kind) and r["samples_per_s"]]
    return max(rates) if rates else None


def _target(name: str, ours: float | None, ref: float | None, goal: float | None, detail: str,
            higher: bool = True) -> dict[str, Any]:
    """One ratio; ``goal`` None: shown for information (a ceiling), never met or missed."""
    ratio = ours / ref if ours is not None and ref else None
    met = None if ratio is None or goal is None else (ratio >= goal if higher else ratio <= goal)
    return {"target": name, "ours": ours, "reference": ref, "ratio": ratio, "goal": goal, "met": met,
            "detail": detail, "higher_is_better": higher}


def _read_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    w = result["config"]["workers"]
    out = [
        _target(f"mmap pixels, {w} workers, vs naive np.memmap Dataset", _rate(result, "ours", "mmap", "pixels", w),
                _rate(result, "peer", "memmap", "pixels", w), 3.0, "best of processes / threads"),
        _target("mmap pixels, 0 workers, vs naive np.memmap Dataset", _rate(result, "ours", "mmap", "pixels", 0),
                _rate(result, "peer", "memmap", "pixels", 0), 1.0, "best of DataLoader / ThreadLoader"),
    ]
    have_ffcv = result["have"].get("ffcv")
    ref_name = "ffcv" if have_ffcv else "threadpool"
    ref = _rate(result, "peer", ref_name, "bytes", w)
    plain0 = {n: _rate(result, "peer", n, "bytes", 0) for n in ("folder", "lmdb", "webdataset")}
    best0 = max((v for v in plain0.values() if v), default=None)
    best0_name = max((k for k in plain0 if plain0[k]), key=lambda k: plain0[k] or 0, default="-")
    for fmt in FORMATS:
        out.append(_target(f"bytes, {w} workers, {fmt} vs {'FFCV thread loader' if have_ffcv else 'plain thread pool'}",
                           _rate(result, "ours", fmt, "bytes", w), ref, 0.5, "best of processes / threads"))
    for fmt in FORMATS:
        out.append(_target(f"bytes, 0 workers, {fmt} vs best plain peer ({best0_name})",
                           _rate(result, "ours", fmt, "bytes", 0), best0, 1.0, "best of DataLoader / ThreadLoader"))
    best_dec = max((_rate(result, "ours", f, "decoded", w) or 0 for f in FORMATS), default=0) or None
    ceiling = 2 * result["ceiling"]["eval_transform_per_core"] if result.get("ceiling") else None
    if have_ffcv:
        ffcv_dec = _rate(result, "peer", "ffcv", "decoded", w)
        out.append(_target(f"decoded, {w} workers, best of ours vs FFCV's loader", best_dec, ffcv_dec, 1.25,
                           "eval recipe, 224x224 uint8"))
        out.append(_target(f"decoded, {w} workers: the ceiling ({w} cores x our per-core transform rate) vs FFCV's "
                           "loader", ceiling, ffcv_dec, None, "no loader of ours can beat it; FFCV decodes its own "
                           "re-encoded files"))
    out.append(_target(f"decoded, {w} workers, best of ours vs {w} cores x the per-core transform rate",
                       best_dec, ceiling, None, "the ceiling: every core decoding, nothing else; "
                       "a CPU-time rate, so only on an idle machine a wall-clock one"))
    return out


def _pack_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = result["packs"]
    if not rows:
        return []
    plain = {r["name"]: r["images_per_s"] for r in rows if r["name"].startswith("peer") and r["images_per_s"]}
    if not plain:
        return []
    best_name = max(plain, key=plain.get)
    out = []
    check = (result.get("ceiling") or {}).get("validate_per_core")
    cores = (result.get("machine") or {}).get("usable_cpus") or 1
    ceilings = {}  # format -> images/s: every core validating and doing the rest of that format's pack
    if check:
        out.append(_target(f"packing, validation on: the ceiling ({cores} cores x the per-core validation rate) "
                           f"vs fastest plain writer ({best_name[5:]})", cores * check, plain[best_name], None,
                           "no pack with validation can beat it: every core checking entropy data, nothing else"))
        for r in rows:
            if r["name"].startswith("ours") and not r["validate"] and r.get("cpu_us_per_image"):
                fmt = r["name"][5:]
                ceilings[fmt] = cores / (1 / check + r["cpu_us_per_image"] * 1e-6)
                out.append(_target(
                    f"packing {fmt}, validation on: its ceiling ({cores} cores / CPU per image of validation + "
                    f"the pack without it) vs fastest plain writer ({best_name[5:]})", ceilings[fmt],
                    plain[best_name], None, f"the pack without validation took {r['cpu_us_per_image']:.0f} us "
                    "of CPU per image; a pack with it does that work too"))
    for r in rows:
        if r["name"].startswith("ours"):
            fmt = r["name"][5:]
            goal = 0.5 if r["validate"] else 1.0
            reach = ceilings.get(fmt) if r["validate"] else None
            out.append(_target(f"packing {fmt}, validation {'on' if r['validate'] else 'off'}, "
                               f"vs fastest plain writer ({best_name[5:]})", r["images_per_s"], plain[best_name],
                               goal, f"{r['images_per_s'] / reach:.0%} of its ceiling" if reach else ""))
    return out


def _memory_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for w in (0, result["config"]["workers"]):
        base = [r for r in result["reads"] if (r["who"], r["name"], r["mode"], r["workers"])
                == ("peer", "folder", "decoded", w)]
        if not base or base[0]["private_mb"] is None:
            continue
        ours = [r for r in result["reads"] if r["who"] == "ours" and r["workers"] == w and r["private_mb"]]
        for fmt in FORMATS + ("mmap",):
            mine = [r for r in ours if r["name"] == fmt]
            if not mine:
                continue
            worst = max(mine, key=lambda r: r["private_mb"])
            out.append(_target(f"memory, {fmt}, {w} workers: private PSS vs naive folder (worst mode: "
                               f"{worst['mode']} {worst['kind']})", worst["private_mb"], base[0]["private_mb"],
                               1.1, f"data file mapped: {worst['mapped_mb']:.0f} MB (page cache, not counted)",
                               higher=False))
    return out


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue as ``{target, ours, reference, ratio, goal, met, detail}``."""
    return _read_targets(result) + _pack_targets(result) + _memory_targets(result)


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def report(result: dict[str, Any]) -> str:
    """Tables: reads, packing, targets, then the machine and notes."""
    m, cfg = result["machine"], result["config"]
    threads = cfg.get("torch_threads")
    lines = [f"side by side: {cfg['images']} ImageNet-like JPEGs, batch {cfg['batch_size']}, warm page cache, "
             f"median of {cfg['repeats']} (packs: {cfg.get('pack_repeats', cfg['repeats'])}); "
             f"mmap {cfg['mmap_size']}x{cfg['mmap_size']}; torch intra-op threads "
             f"per measuring process: {threads or 'default'}",
             "", f"{'reader':44s} {'samples/s':>10s} {'private MB':>10s} {'mapped MB':>9s} {'load':>5s} {'foreign':>7s}"]
    for r in result["reads"]:
        label = f"{r['who']}:{r['name']} {r['mode']} w={r['workers']}" + (
            f" {r['kind']}" if r["workers"] or r["who"] == "ours" else "")
        foreign = "-" if r["foreign"] is None else f"{r['foreign']:.0%}"
        lines.append(f"{label:44s} {_fmt(r['samples_per_s']):>10s} {_fmt(r['private_mb']):>10s} "
                     f"{_fmt(r['mapped_mb']):>9s} {_fmt(r['load'], 1):>5s} {foreign:>7s}")
    if result["packs"]:
        lines += ["", f"{'packer':44s} {'images/s':>10s} {'CPU us/image':>12s} {'load':>5s} {'foreign':>7s}"]
        for r in result["packs"]:
            label = f"{r['name']} validation {'on' if r['validate'] else 'off'}"
            foreign = "-" if r["foreign"] is None else f"{r['foreign']:.0%}"
            lines.append(f"{label:44s} {_fmt(r['images_per_s']):>10s} {_fmt(r.get('cpu_us_per_image')):>12s} "
                         f"{_fmt(r['load'], 1):>5s} {foreign:>7s}")
    c = result.get("ceiling") or {}
    if c:
        lines += ["", f"per-core ceilings: the eval transform decodes {c['eval_transform_per_core']:,.0f} images per "
                  f"CPU-second on one core ({c['wall_per_core']:,.0f}/s wall); the packer validates "
                  f"{c.get('validate_per_core', 0):,.0f} JPEGs per CPU-second (kept as they are: 1/8-scale "
                  "luma decode, every coefficient entropy-decoded)"]
    lines += ["", f"{'target':86s} {'ratio':>7s} {'goal':>7s}  result"]
    for t in targets(result):
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        goal = "" if t["goal"] is None else (">= " if t["higher_is_better"] else "<= ") + f"{t['goal']:g}x"
        verdict = "info" if t["goal"] is None else "n/a" if t["met"] is None else "met" if t["met"] else "NOT MET"
        lines.append(f"{t['target']:86s} {ratio:>7s} {goal:>7s}  {verdict}" + (f"  ({t['detail']})" if t["detail"] else ""))
    foreign = m.get("foreign_cpu") or {}
    lines += ["", f"machine: {m['cpu_model']}, {m['usable_cpus']} usable cores, torch {m['torch']}; load average "
              f"per measurement and other processes' CPU share are in the table (whole run: "
              f"{foreign.get('overall', 0):.0%} foreign CPU, worst measurement {foreign.get('max_interval', 0):.0%})",
              f"run took {result['seconds']:.0f} s"]
    lines += result.get("peer_lines", [])  # the 2026 peers skipped or failing their check, a line each
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def draw_side_chart(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """Horizontal bars of samples/s per reader, one panel per group (pixels, bytes, decoded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("mmap pixels", "pixels"), ("bytes (decode=False)", "bytes"), ("decoded (eval transform)", "decoded")]
    groups = [(t, m) for t, m in groups if any(r["mode"] == m for r in result["reads"])]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3 + 2.2 * len(groups)), squeeze=False)
    for ax, (title, mode) in zip(axes[:, 0], groups):
        rows = [r for r in result["reads"] if r["mode"] == mode and r["samples_per_s"]]
        labels = [f"{r['who']}:{r['name']} w={r['workers']}" + (
            f" {r['kind'][:4]}" if r["workers"] or r["who"] == "ours" else "") for r in rows]
        colors = ["#4c72b0" if r["who"] == "ours" else "#aaaaaa" for r in rows]
        ax.barh(range(len(rows)), [r["samples_per_s"] for r in rows], color=colors)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("samples/s (ours blue, peers grey)", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown(result: dict[str, Any]) -> str:
    """The run as Markdown tables (targets, reading, packing), for the docs."""
    w = result["config"]["workers"]
    out = ["| target | ours | reference | ratio | goal | result |", "|---|---:|---:|---:|---:|---|"]
    for t in targets(result):
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        goal = "" if t["goal"] is None else ("≥ " if t["higher_is_better"] else "≤ ") + f"{t['goal']:g}x"
        verdict = "info" if t["goal"] is None else "n/a" if t["met"] is None else "met" if t["met"] else "**not met**"
        out.append(f"| {t['target']} | {_fmt(t['ours'])} | {_fmt(t['reference'])} | {ratio} | {goal} | {verdict} |")
    out += ["", f"| reader | mode | 0 workers | {w} worker processes | {w} threads | private MB ({w} w, worst) |",
            "|---|---|---:|---:|---:|---:|"]
    seen: list[tuple[str, str, str]] = []
    for r in result["reads"]:
        key = (r["who"], r["name"], r["mode"])
        if key not in seen:
            seen.append(key)
    for who, name, mode in seen:
        rows = [r for r in result["reads"] if (r["who"], r["name"], r["mode"]) == (who, name, mode)]

        def rate(workers: int, kind: str | None) -> str:
            vals = [r["samples_per_s"] for r in rows if r["workers"] == workers and (kind is None or r["kind"] == kind)]
            return _fmt(max(vals)) if vals else ""

        zero = rate(0, None)
        procs = rate(w, "processes")
        threads = rate(w, "threads")
        mem = [r["private_mb"] for r in rows if r["workers"] == w and r["private_mb"] is not None]
        label = f"{'**ours**' if who == 'ours' else 'peer'}: {name}"
        out.append(f"| {label} | {mode} | {zero} | {procs} | {threads} | {_fmt(max(mem)) if mem else ''} |")
    if result["packs"]:
        out += ["", "| packer | validation | images/s | CPU µs per image |", "|---|---|---:|---:|"]
        for r in result["packs"]:
            label = f"{'**ours**' if r['name'].startswith('ours') else 'peer'}: {r['name'].split(':')[1]}"
            out.append(f"| {label} | {'on' if r['validate'] else 'off'} | {_fmt(r['images_per_s'])} | "
                       f"{_fmt(r.get('cpu_us_per_image'))} |")
    if result.get("peer_lines"):
        out += [""] + [f"* {line}" for line in result["peer_lines"]]
    return "\n".join(out)
