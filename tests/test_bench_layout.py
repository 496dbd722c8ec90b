"""The code's shape (issue 32 item 1): no module of ``packer``, ``readers`` or ``dataset_bench`` (at any
depth) and no script of ``benchmarks/`` over 600 lines, and the package docstring names every module of
``dataset_bench``."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("folder", ["dataset_bench", "benchmarks", "packer", "readers"])
def test_no_module_is_over_600_lines(folder):
    """Every ``*.py`` under the folder, sub-packages included (``readers/contract/spec.py``, ...)."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted((ROOT / folder).rglob("*.py"))}
    assert sizes and max(sizes.values()) < 600, {k: v for k, v in sizes.items() if v >= 600}


def test_the_package_docstring_names_every_module():
    import dataset_bench

    doc = dataset_bench.__doc__ or ""
    missing = [p.stem for p in sorted((ROOT / "dataset_bench").glob("*.py"))
               if p.name != "__init__.py" and f":mod:`dataset_bench.{p.stem}`" not in doc]
    assert not missing, f"dataset_bench/__init__.py does not list {missing}"
