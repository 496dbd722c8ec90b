"""The view's pages (the templates of :mod:`~packer.tools.view.templates`) and its class histogram
(matplotlib, rendered to SVG once per split).

One set of pages serves both the live server and ``--html``: thumbnails are inlined as ``data:`` URIs
in both, so a grid page is one response and a damaged sample's one-line error takes its thumbnail's place.
"""

from __future__ import annotations

import base64
import io
from typing import Any
from urllib.parse import quote

from packer.tools.info import field_stats_text, size_text, source_line
from packer.tools.view.data import DatasetView, Split, png_bytes
from packer.tools.view.templates import CSS, ENV

__all__ = ["render_overview", "render_grid", "render_sample", "render_rejects", "render_report", "histogram_svg",
           "data_uri", "PER_PAGE"]

PER_PAGE = 100  # grid samples per page
_MAX_BARS = 60  # the histogram (and the class table) shows the largest classes beyond this many
_SELECT_CLASSES = 1000  # the grid's class filter is a list of names up to this many classes, else a number
_MANY = 100_000  # beyond this many classes, the first ones are shown (no sort of millions)


def histogram_svg(split: Split) -> str:
    """The class histogram of ``split`` as an inline SVG (its largest classes when there are many)."""
    if split.chart is None:  # made once: matplotlib takes ~0.1 s a chart
        split.chart = _histogram(_classes(split))
    return split.chart


def _classes(split: Split) -> list[dict[str, Any]]:
    counts = split.desc.get("classes") or []
    if len(counts) <= _MAX_BARS:
        return list(counts)
    if len(counts) > _MANY:
        return list(counts[:_MAX_BARS])
    samples = [c["samples"] for c in counts]
    top = sorted(range(len(samples)), key=lambda k: -samples[k])[:_MAX_BARS]
    return [counts[k] for k in top]


def _histogram(rows: list[dict[str, Any]]) -> str:
    if not rows or not any(c["samples"] for c in rows):
        return ""
    from matplotlib.figure import Figure  # the object API: no pyplot, no global backend state

    fig = Figure(figsize=(min(12.0, 1.5 + 0.28 * len(rows)), 2.8))
    ax = fig.add_subplot()
    ax.bar(range(len(rows)), [c["samples"] for c in rows], color="#4a78b0")
    ax.set_xticks(range(len(rows)), [str(c["name"])[:16] for c in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("samples")
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg")
    text = out.getvalue()
    return text[text.index("<svg"):]


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _page(name: str, token: str, **kw: Any) -> str:
    q = f"?token={quote(token)}" if token else ""
    kw.setdefault("nav", True)
    return ENV.get_template(name).render(css=CSS, q=q, amp=q.replace("?", "&"), token=token, **kw)


def _split_summary(s: Split) -> dict[str, Any]:
    d = s.desc
    classes = _classes(s)
    stats = d.get("field_stats") or {}
    return {"name": s.name, "desc": d, "hist": histogram_svg(s), "classes": classes, "shown": len(classes),
            "more": len(d.get("classes") or []) > len(classes),
            "disk": f"{size_text(d['bytes_on_disk'])} ({d['bytes_on_disk']:,} bytes in {d['files']} files)",
            "summary": f"{d['samples']} samples from {source_line(d)}",
            "fields": [{"name": f.get("name"), "type": f.get("type"), "stats": field_stats_text(f, stats)}
                       for f in d.get("fields") or []]}


def render_overview(view: DatasetView, token: str = "", grid: str = "") -> str:
    """The overview: per split its format, counts, schema with statistics, sizes, summary and classes."""
    return _page("overview.html", token, title=f"{view.desc['path']}: overview", path=view.desc["path"],
                 splits=[_split_summary(s) for s in view.splits.values()], grid=grid, nav=not grid, links=not grid)


def render_grid(view: DatasetView, split: Split, *, page: int, per: int, cls: int | None, seed: int | None,
                token: str = "", standalone: bool = True) -> str:
    """A page of ``per`` thumbnails of ``split`` (class ``cls`` only, shuffled with ``seed``), each with
    its caption, or its one-line error. ``standalone=False``: the bare grid, for ``--html``."""
    order = split.indices(cls, seed)
    total = len(order)
    start = min(page * per, total)
    stop = min(start + per, total)
    cells = [split.cell(i) for i in order[start:stop]]
    for c in cells:
        c["src"] = data_uri(png_bytes(c["pixels"])) if c["pixels"] is not None else ""
    query = {"split": split.name, "cls": cls, "seed": seed, "per": per, "token": token or None}
    base = "/grid?" + "&".join(f"{k}={quote(str(v))}" for k, v in query.items() if v is not None)

    def link(p: int) -> str:
        return f"{base}&page={p}"

    classes = list(split.reader.classes) if split.has_label and len(split.reader.classes) <= _SELECT_CLASSES else []
    return _page("grid.html", token, title=f"{split.name}: grid", split=split, splits=list(view.splits), cls=cls,
                 classes=classes,
                 seed=seed, per=per, start=start, stop=stop, total=total, cells=cells, pager=standalone, link=link,
                 prev=page - 1 if page > 0 else None, next=page + 1 if stop < total else None,
                 layout="base.html" if standalone else "bare.html")


def render_sample(split: Split, i: int, token: str = "") -> str:
    """Sample ``i``'s page: the image with its boxes, every field, key, source name, CRC, where it lives."""
    s = split.sample(i)
    return _page("sample.html", token, title=s["key"], s=s)


def render_rejects(view: DatasetView, token: str = "") -> str:
    """Each split's ``rejects.jsonl`` grouped by reason, a thumbnail where the source file still decodes."""
    rejects = []
    for s in view.splits.values():
        groups = s.rejects()
        for rows in groups.values():
            for r in rows:
                r["src"] = data_uri(r["thumb"]) if r["thumb"] else ""
        rejects.append((s.name, groups))
    return _page("rejects.html", token, title="rejects", rejects=rejects)


def render_report(view: DatasetView, samples: int, seed: int | None) -> str:
    """``--html``: the overview and a grid of ``samples`` samples per split, one self-contained file."""
    grids = "".join(render_grid(view, s, page=0, per=samples, cls=None, seed=seed, standalone=False)
                    for s in view.splits.values())
    return render_overview(view, grid=grids)
