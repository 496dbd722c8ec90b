"""The side-by-side run (:mod:`dataset_bench.sidebyside`) as targets met / not met, tables and a chart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dataset_bench.sidecases import DEFAULTS, FORMATS, MODES

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


def _best_peer(result: dict[str, Any], mode: str, workers: int) -> tuple[str, float | None]:
    """The fastest peer of the run in ``mode`` with ``workers`` workers (any kind): (name, samples/s)."""
    rates = {r["name"]: r["samples_per_s"] for r in result["reads"]
             if (r["who"], r["mode"], r["workers"]) == ("peer", mode, workers) and r["samples_per_s"]}
    if not rates:
        return "-", None
    name = max(rates, key=lambda k: rates[k])
    return name, rates[name]


def _chose(result: dict[str, Any], name: str, mode: str, workers: int) -> str:
    """'make_loader chose <kind>' for our defaults row, as the row recorded it."""
    rows = [r for r in result["reads"] if (r["who"], r["name"], r["mode"], r["workers"], r["kind"])
            == ("ours", name, mode, workers, DEFAULTS)]
    return f"make_loader chose {rows[0].get('chosen') or '?'}" if rows else "not measured"


def _read_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The read targets of issue 26's "Done when", all with ``make_loader``'s defaults and ``workers``
    workers, then the 0-worker rows and the decode ceilings (for information)."""
    w = result["config"]["workers"]

    def ours(name: str, mode: str, kind: str | None = DEFAULTS, workers: int = w) -> float | None:
        return _rate(result, "ours", name, mode, workers, kind)

    out = [
        _target(f"raw pixels (mmap as stored), {w} workers, make_loader defaults vs naive np.memmap Dataset",
                ours("mmap", "pixels"), _rate(result, "peer", "memmap", "pixels", w), 3.0,
                _chose(result, "mmap", "pixels", w)),
        _target("mmap pixels, 0 workers, vs naive np.memmap Dataset", ours("mmap", "pixels", None, 0),
                _rate(result, "peer", "memmap", "pixels", 0), 1.0, "best of DataLoader / ThreadLoader"),
        _target(f"raw224 (mmap center-cropped to 224), {w} workers, make_loader defaults vs raw pixels, "
                "make_loader defaults", ours("mmap", "raw224"), ours("mmap", "pixels"), 0.8,
                _chose(result, "mmap", "raw224", w)),
        _target(f"raw224, {w} workers, make_loader defaults vs naive np.memmap Dataset cropped in numpy",
                ours("mmap", "raw224"), _rate(result, "peer", "memmap", "raw224", w), None,
                "the same crop, by hand"),
    ]
    best_name, best = _best_peer(result, "bytes", w)
    for fmt in FORMATS:
        out.append(_target(f"bytes, {w} workers, {fmt}, make_loader defaults vs best peer ({best_name})",
                           ours(fmt, "bytes"), best, 1.5, _chose(result, fmt, "bytes", w)))
    for fmt in FORMATS:
        out.append(_target(f"bytes, {w} workers, {fmt}, make_loader defaults vs our workers=\"threads\"",
                           ours(fmt, "bytes"), ours(fmt, "bytes", "threads"), 0.8, _chose(result, fmt, "bytes", w)))
    plain0 = {n: _rate(result, "peer", n, "bytes", 0) for n in ("folder", "lmdb", "webdataset")}
    best0 = max((v for v in plain0.values() if v), default=None)
    best0_name = max((k for k in plain0 if plain0[k]), key=lambda k: plain0[k] or 0, default="-")
    for fmt in FORMATS:
        out.append(_target(f"bytes, 0 workers, {fmt} vs best plain peer ({best0_name})",
                           ours(fmt, "bytes", None, 0), best0, 1.0, "best of DataLoader / ThreadLoader"))
    any0_name, any0 = _best_peer(result, "bytes", 0)  # FFCV, when measured, at its least: one thread
    out.append(_target(f"bytes, 0 workers, wds vs best peer ({any0_name})", ours("wds", "bytes", None, 0), any0, 1.5,
                       "best of DataLoader / ThreadLoader" + ("; FFCV with one thread" if any0_name == "ffcv" else "")))
    dec_name, dec = _best_peer(result, "decoded", w)
    ceilings = result.get("ceiling") or {}
    for mode, what, key in (("decoded", "fused eval", "eval_transform_per_core"),
                            ("train", "fused train", "train_transform_per_core")):
        mine = {f: rate for f in FORMATS if (rate := ours(f, mode))}
        best_fmt = max(mine, key=lambda k: mine[k]) if mine else None
        detail = (f"{best_fmt}, {_chose(result, best_fmt, mode, w)}" if best_fmt else "not measured") + (
            "; the peers run their eval recipe" if mode == "train" else "")
        out.append(_target(f"decoded, {what} transform, {w} workers, make_loader defaults, best of ours vs best "
                           f"peer ({dec_name})", mine.get(best_fmt) if best_fmt else None, dec, 1.25, detail))
        ceiling = w * ceilings[key] if ceilings.get(key) else None
        out.append(_target(f"decoded, {what}: the ceiling ({w} cores x our per-core transform rate) vs best peer "
                           f"({dec_name})", ceiling, dec, None, "no loader of ours can beat it" + (
                               "; FFCV decodes its own re-encoded files" if dec_name == "ffcv" else "")))
        out.append(_target(f"decoded, {what}, {w} workers, make_loader defaults, best of ours vs the ceiling",
                           mine.get(best_fmt) if best_fmt else None, ceiling, None, "every core decoding, nothing else; "
                           "a CPU-time rate, so only on an idle machine a wall-clock one"))
    folder = _rate(result, "peer", "folder", "decoded", w)
    for fmt in FORMATS:
        out.append(_target(f"user PIL transform, {w} workers, {fmt}, make_loader defaults vs naive folder (same "
                           "transform)", ours(fmt, "pil"), folder, 1.0, _chose(result, fmt, "pil", w)))
    return out


def _pack_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = result["packs"]
    if not rows:
        return []
    plain = {r["name"]: r["images_per_s"] for r in rows if r["name"].startswith("peer") and r["images_per_s"]}
    if not plain:
        return []
    best_name = max(plain, key=lambda k: plain[k])
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
            f" {r['kind']}" if r["workers"] or r["who"] == "ours" else "") + (
            f" ({r.get('chosen') or '?'})" if r["kind"] == DEFAULTS else "")
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
        train = c.get("train_transform_per_core")
        lines += ["", f"per-core ceilings: the eval transform decodes {c['eval_transform_per_core']:,.0f} images per "
                  f"CPU-second on one core ({c['wall_per_core']:,.0f}/s wall)"
                  + (f", the train transform {train:,.0f}" if train else "") + "; the packer validates "
                  f"{c.get('validate_per_core', 0):,.0f} JPEGs per CPU-second (kept as they are: 1/8-scale "
                  "luma decode, every coefficient entropy-decoded)"]
    lines += ["", f"{'target':86s} {'ratio':>7s} {'goal':>7s}  result"]
    for t in targets(result):
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        goal = "" if t["goal"] is None else (">= " if t["higher_is_better"] else "<= ") + f"{t['goal']:g}x"
        verdict = "info" if t["goal"] is None else "n/a" if t["met"] is None else "met" if t["met"] else "NOT MET"
        lines.append(f"{t['target']:86s} {ratio:>7s} {goal:>7s}  {verdict}" + (f"  ({t['detail']})" if t["detail"] else ""))
    whole = m.get("foreign_cpu") or {}
    lines += ["", f"machine: {m['cpu_model']}, {m['usable_cpus']} usable cores, torch {m['torch']}; load average "
              f"per measurement and other processes' CPU share are in the table (whole run: "
              f"{whole.get('overall', 0):.0%} foreign CPU, worst measurement {whole.get('max_interval', 0):.0%})",
              f"run took {result['seconds']:.0f} s"]
    lines += result.get("peer_lines", [])  # the 2026 peers skipped or failing their check, a line each
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def draw_side_chart(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """Horizontal bars of samples/s per reader, one panel per group (pixels, bytes, decoded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("mmap pixels", "pixels"), ("mmap pixels center-cropped to 224", "raw224"),
              ("bytes (decode=False)", "bytes"), ("decoded (fused eval transform)", "decoded"),
              ("decoded (fused train transform)", "train"), ("a user's PIL transform (ours: make_loader defaults)", "pil")]
    groups = [(t, m) for t, m in groups if any(r["mode"] == m for r in result["reads"])]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3 + 2.2 * len(groups)), squeeze=False)
    w = result["config"]["workers"]
    # train and pil have no peer rows of their own: the decoded peers (pil: the naive folder) stand beside them
    refs = {"train": lambda r: r["mode"] == "decoded", "pil": lambda r: (r["name"], r["mode"]) == ("folder", "decoded")}
    for ax, (title, mode) in zip(axes[:, 0], groups):
        rows = [r for r in result["reads"] if r["samples_per_s"] and (r["mode"] == mode or (
            mode in refs and r["who"] == "peer" and r["workers"] == w and refs[mode](r)))]
        labels = [f"{r['who']}:{r['name']}" + (f" {r['mode']}" if r["mode"] != mode else "") + f" w={r['workers']}"
                  + (f" {r['kind'][:4]}" if r["workers"] or r["who"] == "ours" else "")
                  + (f"->{(r.get('chosen') or '?')[:4]}" if r["kind"] == DEFAULTS else "") for r in rows]
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
    out += ["", f"| reader | mode | 0 workers | {w} worker processes | {w} threads | {w} workers, make_loader "
            f"defaults (chosen) | private MB ({w} w, worst) |", "|---|---|---:|---:|---:|---:|---:|"]
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
        chosen = [r.get("chosen") or "?" for r in rows if r["workers"] == w and r["kind"] == DEFAULTS]
        defaults = f"{rate(w, DEFAULTS)} ({chosen[0]})" if chosen else ""
        mem = [r["private_mb"] for r in rows if r["workers"] == w and r["private_mb"] is not None]
        label = f"{'**ours**' if who == 'ours' else 'peer'}: {name}"
        out.append(f"| {label} | {mode} | {zero} | {procs} | {threads} | {defaults} | "
                   f"{_fmt(max(mem)) if mem else ''} |")
    modes = [m for m in MODES if any(r["mode"] == m for r in result["reads"])]
    out += [""] + [f"* `{m}`: {MODES[m]}" for m in modes]
    if result["packs"]:
        out += ["", "| packer | validation | images/s | CPU µs per image |", "|---|---|---:|---:|"]
        for r in result["packs"]:
            label = f"{'**ours**' if r['name'].startswith('ours') else 'peer'}: {r['name'].split(':')[1]}"
            out.append(f"| {label} | {'on' if r['validate'] else 'off'} | {_fmt(r['images_per_s'])} | "
                       f"{_fmt(r.get('cpu_us_per_image'))} |")
    if result.get("peer_lines"):
        out += [""] + [f"* {line}" for line in result["peer_lines"]]
    return "\n".join(out)
