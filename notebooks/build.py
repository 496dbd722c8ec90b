"""Write (and optionally execute) the notebooks from their paired Python files.

Each notebook's cells live in a jupytext "percent" script beside it
(``01_format_throughput.py`` -> ``01_format_throughput.ipynb``): a real Python
file that linters, type checkers and the import graph see. Edit the ``.py``;
this script writes the ``.ipynb``::

    python notebooks/build.py              # sources only; outputs of unchanged cells are kept
    python notebooks/build.py --execute    # ...then run each notebook (kernel python3), keeping outputs
    python notebooks/build.py --check      # exit 1 when an .ipynb's cells differ from its .py

``jupytext --sync notebooks/*.py`` does the same pairing from the command line
(the scripts declare ``formats: ipynb,py:percent``), and ``jupytext --to ipynb
--update --execute`` re-runs one. The committed notebooks carry the outputs of
a real run (``--execute``) on the machine named in their first output.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from jupytext.combine import combine_inputs_with_outputs

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted(p.name for p in HERE.glob("[0-9][0-9]_*.py"))


def from_script(py: Path) -> nbformat.NotebookNode:
    """The notebook a paired script describes: its cells, stable cell ids, the python3 kernel."""
    nb = jupytext.read(py)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable ids: rebuilding does not churn the diff
    nb.metadata.get("jupytext", {}).get("text_representation", {}).pop("jupytext_version", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def differences(py: Path, ipynb: Path) -> list[str]:
    """Why ``ipynb`` does not carry the cells of ``py`` (empty: in sync)."""
    if not ipynb.exists():
        return [f"{ipynb.name} is missing"]
    want = [(c.cell_type, c.source) for c in from_script(py).cells]
    have = [(c.cell_type, c.source) for c in nbformat.read(ipynb, as_version=4).cells]
    out = [f"{ipynb.name} has {len(have)} cells, {py.name} {len(want)}"] if len(want) != len(have) else []
    out += [f"cell {i}: {ipynb.name} differs from {py.name}" for i, (a, b) in enumerate(zip(want, have)) if a != b]
    return out


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 900) -> float:
    """Run ``nb`` in place with the ``python3`` kernel in ``cwd``; returns the seconds it took."""
    from nbclient import NotebookClient

    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return time.perf_counter() - t0


def build(py: Path, run: bool = False) -> Path:
    """Write ``py``'s notebook beside it: executed when ``run``, else with the outputs of unchanged cells."""
    ipynb = py.with_suffix(".ipynb")
    nb = from_script(py)
    if run:
        print(f"executed {ipynb.name} in {execute(nb, HERE):.0f} s")
    elif ipynb.exists():
        nb = combine_inputs_with_outputs(nb, nbformat.read(ipynb, as_version=4))
    nbformat.write(nb, ipynb)
    return ipynb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--execute", action="store_true", help="run the notebooks after writing them")
    p.add_argument("--check", action="store_true", help="only compare each .ipynb with its .py")
    p.add_argument("names", nargs="*", help=f"scripts to build (default: {', '.join(NOTEBOOKS)})")
    args = p.parse_args(argv)
    scripts = [HERE / Path(n).with_suffix(".py").name for n in (args.names or NOTEBOOKS)]
    if args.check:
        problems = [d for py in scripts for d in differences(py, py.with_suffix(".ipynb"))]
        print("\n".join(problems) or "in sync")
        return 1 if problems else 0
    for py in scripts:
        print(f"wrote {build(py, args.execute)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
